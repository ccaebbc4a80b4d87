package dsn_test

import (
	"bytes"
	"errors"
	"fmt"
	"net/url"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/cmd/idemctl/internal/dsn"
)

// pw is the secret every case hides; in some it is spelled another way
// (escaped, quoted), which the case's secret field gives.
const pw = "Hunter2Secret"

// Cases is the redaction table: each form the drivers accept (and
// malformed ones), the secret in it and what Redact prints. The report of
// issue 23 quotes it.
var Cases = []struct {
	name, in, want string
	secret         string // as written in in; default pw
}{
	// URL user info.
	{"postgres userinfo", "postgres://app:" + pw + "@db:5432/app?sslmode=disable", "postgres://app:xxxxx@db:5432/app?sslmode=disable", ""},
	{"postgresql userinfo", "postgresql://app:" + pw + "@db/app", "postgresql://app:xxxxx@db/app", ""},
	{"postgres multi-host", "postgres://app:" + pw + "@h1:5432,h2:5433/app", "postgres://app:xxxxx@h1:5432,h2:5433/app", ""},
	{"escaped password", "postgres://app:p%40ss%2Fw%3Fd@db/app", "postgres://app:xxxxx@db/app", "p@ss/w?d"},
	{"mysql url", "mysql://root:" + pw + "@127.0.0.1:3306/test", "mysql://root:xxxxx@127.0.0.1:3306/test", ""},
	{"redis password only", "redis://:" + pw + "@127.0.0.1:6379/0", "redis://:xxxxx@127.0.0.1:6379/0", ""},
	{"rediss user and password", "rediss://app:" + pw + "@cache:6380/1", "rediss://app:xxxxx@cache:6380/1", ""},
	{"amqp", "amqp://guest:" + pw + "@127.0.0.1:5672/", "amqp://guest:xxxxx@127.0.0.1:5672/", ""},
	{"user without password", "postgres://postgres@127.0.0.1:5432/test", "postgres://postgres@127.0.0.1:5432/test", "-"},
	// Query parameters.
	{"postgres password=", "postgres://postgres@127.0.0.1:1/test?sslmode=disable&password=" + pw, "postgres://postgres@127.0.0.1:1/test?sslmode=disable&password=xxxxx", ""},
	{"postgres sslpassword=", "postgres://postgres@127.0.0.1:1/test?sslpassword=" + pw + "&sslmode=disable", "postgres://postgres@127.0.0.1:1/test?sslpassword=xxxxx&sslmode=disable", ""},
	{"encoded key pass%77ord", "postgres://db/test?pass%77ord=" + pw, "postgres://db/test?pass%77ord=xxxxx", ""},
	{"mysql url password=", "mysql://root@127.0.0.1:3306/test?password=" + pw, "mysql://root@127.0.0.1:3306/test?password=xxxxx", ""},
	{"redis password=", "redis://127.0.0.1:6379/0?password=" + pw, "redis://127.0.0.1:6379/0?password=xxxxx", ""},
	{"query value with fragment", "postgres://db/test?password=" + pw + "#x", "postgres://db/test?password=xxxxx", ""},
	// PostgreSQL keyword/value.
	{"keyword/value", "host=127.0.0.1 port=1 user=app password=" + pw + " dbname=test", "host=127.0.0.1 port=1 user=app password=xxxxx dbname=test", ""},
	{"keyword/value quoted", "host=db password='Hunter 2\\'s' dbname=test", "host=db password='xxxxx' dbname=test", "Hunter 2\\'s"},
	{"keyword/value spaces around =", "host=db password = " + pw, "host=db password = xxxxx", ""},
	{"keyword/value sslpassword", "host=db sslpassword=" + pw + " sslkey=/k.pem", "host=db sslpassword=xxxxx sslkey=/k.pem", ""},
	// go-sql-driver/mysql's own form.
	{"mysql driver DSN", "app:" + pw + "@tcp(127.0.0.1:3306)/test?parseTime=true", "app:xxxxx@tcp(127.0.0.1:3306)/test?parseTime=true", ""},
	{"mysql driver DSN, / and @ in password", "app:a/b@c@tcp(db)/test", "app:xxxxx@tcp(db)/test", "a/b@c"},
	{"mysql driver DSN, no password", "root@tcp(127.0.0.1:3306)/test", "root@tcp(127.0.0.1:3306)/test", "-"},
	// SQLite.
	{"sqlite file: auth", "file:/var/lib/app.db?_auth_user=app&_auth_pass=" + pw, "file:/var/lib/app.db?_auth_user=app&_auth_pass=xxxxx", ""},
	{"sqlite pragma key", "file:app.db?_pragma=key('" + pw + "')&_pragma=busy_timeout(5000)", "file:app.db?_pragma=xxxxx&_pragma=busy_timeout(5000)", "key('" + pw + "')"},
	{"sqlite url", "sqlite:///var/lib/app.db?_auth_pass=" + pw, "sqlite:///var/lib/app.db?_auth_pass=xxxxx", ""},
	{"sqlite no secret", "sqlite:///var/lib/app.db", "sqlite:///var/lib/app.db", "-"},
	// Malformed: more is masked, never less.
	{"unescaped @ and / in password", "postgres://app:a@b/c@db/app", "postgres://xxxxx@db/app", "app:a@b/c"},
	{"unescaped ? in password", "postgres://app:a?" + pw + "@db/app", "postgres://xxxxx@db/app", "app:a?" + pw},
	{"bad escape", "postgres://app:" + pw + "@127.0.0.1:5432/db%zz", "postgres://xxxxx@127.0.0.1:5432/db%zz", "app:" + pw},
	{"unclosed bracket", "postgres://app:" + pw + "@[::1/db", "postgres://xxxxx@[::1/db", "app:" + pw},
	{"non-numeric port", "postgres://a@u:" + pw + "@h/db", "postgres://xxxxx@h/db", "a@u:" + pw},
	{"keyword/value unterminated quote", "host=db password='" + pw + " dbname=x", "host=db password='xxxxx", pw + " dbname=x"},
	{"keyword/value space in password", "host=db password=Hunter2 Secret", "host=db password=xxxxx", "Hunter2 Secret"},
	{"keyword/value garbage then password", "host=db junk password=" + pw, "host=db xxxxx", "junk password=" + pw},
	{"mysql driver DSN without /", "app:" + pw + "@tcp(db:3306)", "xxxxx@tcp(db:3306)", "app:" + pw},
	{"no known form", "password: " + pw, "password: xxxxx", ""},
}

func TestRedact(t *testing.T) {
	for _, c := range Cases {
		t.Run(c.name, func(t *testing.T) {
			got := dsn.Redact(c.in)
			require.Equal(t, c.want, got)
			secrets := dsn.Secrets(c.in)
			if c.secret == "-" {
				require.Empty(t, secrets)
				return
			}
			secret := c.secret
			if secret == "" {
				secret = pw
			}
			require.Contains(t, secrets, secret)
			require.NotContains(t, got, secret)
			require.NotContains(t, got, pw)
			require.NotContains(t, got, url.QueryEscape(secret))
		})
	}
}

// Secrets finds what the drivers read, even when the driver decodes it
// from the written form.
func TestSecretsAreWhatTheDriversRead(t *testing.T) {
	pg, err := pgconn.ParseConfig("host=db password='Hunter 2\\'s'")
	require.NoError(t, err)
	require.Contains(t, dsn.Secrets("host=db password='Hunter 2\\'s'"), pg.Password)
	pg, err = pgconn.ParseConfig("postgres://app:p%40ss%2Fw%3Fd@db/app")
	require.NoError(t, err)
	require.Contains(t, dsn.Secrets("postgres://app:p%40ss%2Fw%3Fd@db/app"), pg.Password)
	my, err := mysql.ParseDSN("app:a/b@c@tcp(db)/test")
	require.NoError(t, err)
	require.Contains(t, dsn.Secrets("app:a/b@c@tcp(db)/test"), my.Passwd)
}

// A driver error that quotes the DSN, or the password alone, comes out
// masked; so does what goes through the Writer.
func TestScrubber(t *testing.T) {
	var sc dsn.Scrubber
	sc.Add("postgres://app@db/app?password=" + pw)
	sc.Add("redis://:other%20one@cache/0")
	_, err := pgconn.ParseConfig("postgres://app:" + pw + "@db:bad/app")
	require.Error(t, err)
	for _, msg := range []string{
		fmt.Sprintf("connecting to %s: refused", "postgres://app@db/app?password="+pw),
		"near '" + pw + "' at line 1",
		"auth failed for other one",
		"auth failed for other%20one",
		errors.Join(err, errors.New(pw)).Error(),
	} {
		got := sc.Scrub(msg)
		require.NotContains(t, got, pw, msg)
		require.NotContains(t, got, "other one", msg)
		require.NotContains(t, got, "other%20one", msg)
		require.Contains(t, got, dsn.Mask, msg)
	}
	var buf bytes.Buffer
	fmt.Fprintf(sc.Writer(&buf), "idemctl: %s does not answer\n", "redis://:other%20one@cache/0")
	require.Equal(t, "idemctl: redis://:xxxxx@cache/0 does not answer\n", buf.String())
}

// Whatever characters a password holds, written unescaped into any form,
// neither Redact nor a Scrubber lets it through.
func TestUnescapedPasswords(t *testing.T) {
	for _, form := range []string{
		"postgres://app:%s@db:5432/app",
		"postgres://app@db/app?password=%s&sslmode=disable",
		"postgres://app@db/app?sslmode=disable&sslpassword=%s",
		"mysql://root@db:3306/test?password=%s",
		"host=db password=%s dbname=x",
		"host=db password='%s' dbname=x",
		"app:%s@tcp(db:3306)/test",
		"redis://:%s@db:6379/0",
		"rediss://app:%s@db:6380/0?dial_timeout=1s",
		"file:app.db?_auth_pass=%s",
	} {
		for _, secret := range []string{"Hunter2Secret", "p@ss", "a/b", "a?b", "a b", "a'b", "a&b", "a#b", "a:b", "a%zz", "a=b", `a\b`, `@/?#&= :'\`} {
			in := fmt.Sprintf(form, secret)
			got := dsn.Redact(in)
			require.NotContains(t, got, secret, "Redact(%q)", in)
			var sc dsn.Scrubber
			sc.Add(in)
			require.NotContains(t, sc.Scrub("error: "+in), secret, "Scrub(%q)", in)
		}
	}
}

// A short password is masked where it stands alone, not inside words; a
// malformed DSN's guessed secret is masked in every part a driver may
// print (pgconn reads postgres://app:a@Hunter2Secret@h/db's host as
// "Hunter2Secret@h").
func TestScrubberShortAndMalformed(t *testing.T) {
	var sc dsn.Scrubber
	sc.Add("postgres://app:a@db/app")
	require.Equal(t, "database app: password xxxxx refused", sc.Scrub("database app: password a refused"))
	sc.Add("postgres://app:a@" + pw + "@127.0.0.1:1/db")
	got := sc.Scrub("lookup " + pw + "@127.0.0.1: no such host")
	require.NotContains(t, got, pw)
	require.Equal(t, "postgres://xxxxx@127.0.0.1:1/db", dsn.Redact("postgres://app:a@"+pw+"@127.0.0.1:1/db"))
}
