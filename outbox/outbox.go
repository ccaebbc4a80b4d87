package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"unicode/utf8"

	"github.com/idemkit/watermill-idempotent/internal/settings"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/sqldialect"
	"github.com/idemkit/watermill-idempotent/sqlexec"
)

// DefaultTableName is the outbox table used when Config.Table is empty.
const DefaultTableName = "watermill_outbox"

// Dialect names the database of the outbox table.
//
// Deprecated: Config.Dialect takes the stores' value, sqldialect.Dialect
// (postgres.Dialect, mysql.Dialect, sqlite.Dialect name the same ones).
type Dialect = sqldialect.Dialect

// The dialects, as sqldialect names them.
//
// Deprecated: use postgres.Dialect, mysql.Dialect or sqlite.Dialect (or
// sqldialect.PostgreSQL, MySQL, SQLite).
const (
	PostgreSQL = sqldialect.PostgreSQL
	MySQL      = sqldialect.MySQL
	SQLite     = sqldialect.SQLite
)

// Limits on the columns of the outbox table.
const (
	// MaxTopicLength is the longest destination topic the outbox stores.
	MaxTopicLength = 255
	// MaxUUIDLength is the longest message UUID the outbox stores.
	MaxUUIDLength = 255
)

var (
	// ErrInvalidTopic is returned for an empty destination topic, one
	// longer than MaxTopicLength, or one with characters watermill-sql
	// refuses (anything but letters, digits and - $ : . _). A topic too
	// long for its column also wraps repository.ErrDataException.
	ErrInvalidTopic = errors.New("outbox: invalid topic")
	// ErrInvalidMessage is returned for a nil message or one whose UUID
	// is empty, longer than MaxUUIDLength or, on PostgreSQL, holds a NUL
	// byte or invalid UTF-8, which its text refuses. A UUID the database
	// would refuse also wraps repository.ErrDataException, so the inbox
	// middleware treats the delivery that wrote it as permanent
	// (idempotency.IsPermanent) in every pgx query exec mode: in the
	// simple protocol the server answers a NUL byte with a protocol
	// violation instead of a data exception.
	ErrInvalidMessage = errors.New("outbox: invalid message")
)

// The same rule watermill-sql's Publisher applies, so a message accepted
// by WriteTx is also accepted by the Publisher returned by InTx.
var disallowedTopicCharacters = regexp.MustCompile(`[^A-Za-z0-9\-\$\:\.\_]`)

// Config configures an Outbox. The same values must be given to the
// relay's RelayConfig so both sides use one table.
type Config struct {
	// Dialect is the database, the value the stores use: postgres.Dialect,
	// mysql.Dialect or sqlite.Dialect (sqldialect.PostgreSQL, MySQL,
	// SQLite). Required.
	Dialect sqldialect.Dialect
	// Table is the outbox table, optionally schema-qualified
	// ("schema.table"). Default: DefaultTableName. Validated with
	// repository.ValidateTableName, so it cannot carry SQL.
	Table string
	// Logger receives the logs of the publishers InTx and NewPublisher
	// return (watermill-sql's Publisher). Default: watermill.NopLogger.
	Logger watermill.LoggerAdapter
}

func (c *Config) setDefaults() {
	settings.Default(&c.Table, DefaultTableName)
	settings.Logger(&c.Logger)
}

// Validate reports every problem with the configuration at once.
func (c Config) Validate() error {
	var errs []error
	switch c.Dialect {
	case sqldialect.PostgreSQL, sqldialect.MySQL, sqldialect.SQLite:
	case "":
		errs = append(errs, errors.New("missing Config.Dialect (postgres.Dialect, mysql.Dialect or sqlite.Dialect)"))
	default:
		errs = append(errs, fmt.Errorf("unknown Config.Dialect %q (want postgres.Dialect, mysql.Dialect or sqlite.Dialect)", c.Dialect))
	}
	if err := repository.ValidateTableName(c.Table); err != nil {
		errs = append(errs, err)
	}
	return settings.Invalid("outbox", errs)
}

// Outgoing is one message bound for a destination topic, the unit
// WriteTx stores.
type Outgoing struct {
	// Topic is the topic the relay publishes Message to.
	Topic string
	// Message is stored with its UUID, metadata and payload unchanged.
	Message *message.Message
}

// Outbox writes messages into the outbox table inside the caller's
// transaction. It holds no connection and no goroutine; it is safe for
// concurrent use, and one value can serve every transaction of a process.
type Outbox struct {
	config  Config
	dialect dialect
	adapter schemaAdapter
}

// New validates config and returns an Outbox. It does not touch the
// database: create the table up front with Migrate, or apply the shipped
// files in Migrations with your migration tool.
func New(config Config) (*Outbox, error) {
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return nil, err
	}
	d := newDialect(config.Dialect, config.Table)
	return &Outbox{config: config, dialect: d, adapter: schemaAdapter{d: d}}, nil
}

// Config returns the validated configuration with defaults applied.
func (o *Outbox) Config() Config { return o.config }

// Migrate applies the outbox's pending migrations (the files in
// Migrations): the outbox table, its dead-letter table
// (DeadLetterTableName) and, on PostgreSQL, the trigger that sends NOTIFY
// on commit. It runs under the same lock as the stores' migrations
// (PostgreSQL: an advisory lock; MySQL: GET_LOCK; SQLite: its write
// transaction) and records each migration in sqlstore's migrations table
// (watermill_idempotent_migrations, in the table's schema) as
// "outbox:<table>". Migration 1 creates IF NOT EXISTS, so tables created
// by an earlier version are adopted (PostgreSQL also adds the attempts
// column). Never run it inside a business transaction: DDL commits
// implicitly on MySQL.
func (o *Outbox) Migrate(ctx context.Context, db *sql.DB) error {
	return o.MigrateOn(ctx, sqlexec.Std(db))
}

// MigrateOn is Migrate on a pool of any driver behind sqlexec.DB
// (pgxoutbox.Migrate passes a pgx pool through pgxexec.Pool).
func (o *Outbox) MigrateOn(ctx context.Context, db sqlexec.DB) error {
	if db == nil {
		return errors.New("outbox: migrate: db is nil")
	}
	if _, err := migrationLine(o.config.Dialect).Migrate(ctx, db, o.config.Table); err != nil {
		return fmt.Errorf("outbox: migrate %s: %w", o.config.Table, err)
	}
	return nil
}

// InTx returns a Watermill publisher that inserts every published message
// into the outbox through tx: the rows commit or roll back with tx. It is
// watermill-sql's Publisher over tx with this package's schema adapter
// (payload stored as bytes, destination topic in its own column, UUID and
// metadata kept). Publish(topic, msgs...) writes all msgs in one INSERT,
// and nothing for no msgs; it does not honour a context beyond tx's own.
// The publisher must not be used after tx ends; Close is optional.
//
// A nil tx gives a publisher whose Publish always fails.
func (o *Outbox) InTx(tx *sql.Tx) message.Publisher {
	if tx == nil {
		return failingPublisher{errors.New("outbox: tx is nil")}
	}
	p, err := wsql.NewPublisher(tx, wsql.PublisherConfig{
		SchemaAdapter: schemaAdapter{d: newDialect(o.config.Dialect, o.config.Table)},
		// Never: DDL inside the caller's transaction would commit it on MySQL.
		AutoInitializeSchema: false,
	}, o.config.Logger)
	if err != nil {
		return failingPublisher{fmt.Errorf("outbox: %w", err)}
	}
	return nonEmpty{p}
}

// nonEmpty passes a publish with messages on to watermill-sql's Publisher
// and answers one without any itself: there is no row to insert, and the
// schema adapter is never asked for a statement without rows.
type nonEmpty struct{ message.Publisher }

func (p nonEmpty) Publish(topic string, msgs ...*message.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	return p.Publisher.Publish(topic, msgs...)
}

// WriteTx inserts msgs into the outbox through tx, so they are published
// by the relay if and only if tx commits. Each message keeps its UUID,
// metadata and payload (any bytes) and is published to its own Topic;
// messages of one call are published in the order given. Rows are written
// with multi-row INSERTs of up to 1000 messages.
//
// It validates every message before writing any (ErrInvalidTopic,
// ErrInvalidMessage). On an error tx may hold part of the rows: roll it
// back. WriteTx is what the inbox middleware calls to store a handler's
// output inside the inbox transaction.
func (o *Outbox) WriteTx(ctx context.Context, tx *sql.Tx, msgs ...Outgoing) error {
	if tx == nil {
		return errors.New("outbox: tx is nil")
	}
	return o.WriteOn(ctx, sqlexec.StdTx(tx), msgs...)
}

// WriteOn is WriteTx in a transaction of any driver behind
// sqlexec.Executor (pgxoutbox.WriteTx passes a pgx.Tx through
// pgxexec.Exec).
func (o *Outbox) WriteOn(ctx context.Context, tx sqlexec.Executor, msgs ...Outgoing) error {
	if tx == nil {
		return errors.New("outbox: tx is nil")
	}
	for _, m := range msgs {
		if err := o.dialect.validate(m.Topic, m.Message); err != nil {
			return err
		}
	}
	for start := 0; start < len(msgs); start += maxRowsPerInsert {
		end := min(start+maxRowsPerInsert, len(msgs))
		q, err := o.dialect.insertQuery(msgs[start:end])
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, q.Query, q.Args...); err != nil {
			return fmt.Errorf("outbox: insert %d messages: %w", end-start, err)
		}
	}
	return nil
}

// validate checks a message before it is written to topic. Values the
// database would refuse as data wrap repository.ErrDataException: found
// here, they fail the same way whatever the driver and its query exec
// mode, before anything is sent.
func (d dialect) validate(topic string, msg *message.Message) error {
	switch {
	case topic == "":
		return fmt.Errorf("%w: empty", ErrInvalidTopic)
	case len(topic) > MaxTopicLength:
		return fmt.Errorf("%w: %d bytes, at most %d: %w", ErrInvalidTopic, len(topic), MaxTopicLength, repository.ErrDataException)
	case disallowedTopicCharacters.MatchString(topic):
		return fmt.Errorf("%w: %q has characters matching %s", ErrInvalidTopic, topic, disallowedTopicCharacters)
	case msg == nil:
		return fmt.Errorf("%w: nil message", ErrInvalidMessage)
	case msg.UUID == "":
		return fmt.Errorf("%w: empty UUID", ErrInvalidMessage)
	case len(msg.UUID) > MaxUUIDLength:
		return fmt.Errorf("%w: UUID of %d bytes, at most %d: %w", ErrInvalidMessage, len(msg.UUID), MaxUUIDLength, repository.ErrDataException)
	}
	if d.sql.Name == string(sqldialect.PostgreSQL) {
		// PostgreSQL's text holds neither. Through pgx's extended protocol
		// the server would refuse either as data (22021); in the simple
		// protocol a NUL byte ends the statement's text early and the
		// server reports a malformed message (08P01) instead.
		if strings.IndexByte(msg.UUID, 0) >= 0 {
			return fmt.Errorf("%w: UUID %q holds a NUL byte, which PostgreSQL text cannot: %w", ErrInvalidMessage, msg.UUID, repository.ErrDataException)
		}
		if !utf8.ValidString(msg.UUID) {
			return fmt.Errorf("%w: UUID %q is not valid UTF-8, which PostgreSQL text must be: %w", ErrInvalidMessage, msg.UUID, repository.ErrDataException)
		}
	}
	return nil
}

type failingPublisher struct{ err error }

func (p failingPublisher) Publish(string, ...*message.Message) error { return p.err }
func (p failingPublisher) Close() error                              { return nil }
