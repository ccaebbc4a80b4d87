package broker

import (
	"context"
	stdsql "database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver
)

// The watermill-sql schema on PostgreSQL: a table per topic
// ("watermill_<topic>") and an offsets table per topic
// ("watermill_offsets_<topic>") with a row per consumer group.
var (
	sqlSchema  = wmsql.DefaultPostgreSQLSchema{}
	sqlOffsets = wmsql.DefaultPostgreSQLOffsetsAdapter{}
)

func openSQL(config Config) (*stdsql.DB, error) {
	db, err := stdsql.Open("pgx", config.SQLDSN)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("postgres at %s: %w", config.SQLDSN, err)
	}
	return db, nil
}

func newSQLPublisher(db *stdsql.DB, logger watermill.LoggerAdapter) (*wmsql.Publisher, error) {
	return wmsql.NewPublisher(db, wmsql.PublisherConfig{SchemaAdapter: sqlSchema, AutoInitializeSchema: true}, logger)
}

// newSQLSubscriber returns a subscriber of the consumer group. It reads
// the next message in a transaction that locks the group's offset row
// (SELECT … FOR UPDATE), so the group's subscribers take turns, and moves
// the offset in that transaction when the message is acknowledged. A nack
// resends the message after ResendInterval; a subscriber that closes with
// the message unacknowledged commits its transaction without moving the
// offset (one that dies has it rolled back), and the next subscriber of
// the group reads the same message.
func newSQLSubscriber(db *stdsql.DB, group string, logger watermill.LoggerAdapter) (*wmsql.Subscriber, error) {
	return wmsql.NewSubscriber(db, wmsql.SubscriberConfig{
		ConsumerGroup:    group,
		SchemaAdapter:    sqlSchema,
		OffsetsAdapter:   sqlOffsets,
		InitializeSchema: true,
		PollInterval:     50 * time.Millisecond,
		ResendInterval:   20 * time.Millisecond,
		RetryInterval:    100 * time.Millisecond,
	}, logger)
}

// deleteSQLTopics drops the message and offsets tables of topics.
func deleteSQLTopics(ctx context.Context, db *stdsql.DB, topics []string) error {
	var errs []error
	for _, t := range topics {
		for _, table := range []string{sqlSchema.MessagesTable(t), sqlOffsets.MessagesOffsetsTable(t)} {
			if _, err := db.ExecContext(ctx, `DROP TABLE IF EXISTS `+table); err != nil {
				errs = append(errs, fmt.Errorf("sql cleanup: dropping %s: %w", table, err))
			}
		}
	}
	return errors.Join(errs...)
}
