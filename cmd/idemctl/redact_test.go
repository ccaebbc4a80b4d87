package main

import (
	"net/url"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"
)

// secret is the password of every DSN in TestNoSecretInAnyOutput.
const secret = "Hunter2Secret"

// redactCase is one way idemctl fails with a secret on its command line.
type redactCase struct {
	name string
	flag string // --dsn or --redis; "" when args holds the whole command
	dsn  string
	args []string
	// echoed: the error quotes the DSN, so it must show the mask.
	echoed bool
}

// refusedCases name a closed port: every DSN form the drivers accept.
func refusedCases() []redactCase {
	const at = "127.0.0.1:1"
	return []redactCase{
		{"postgres userinfo", "--dsn", "postgres://postgres:" + secret + "@" + at + "/test?sslmode=disable", nil, true},
		{"postgres password=", "--dsn", "postgres://postgres@" + at + "/test?sslmode=disable&password=" + secret, nil, true},
		{"postgres sslpassword=", "--dsn", "postgres://postgres@" + at + "/test?sslmode=disable&sslpassword=" + secret, nil, true},
		{"postgres keyword/value", "--dsn", "host=127.0.0.1 port=1 user=postgres password=" + secret + " sslmode=disable", nil, true},
		{"postgres keyword/value quoted", "--dsn", "host=127.0.0.1 port=1 password='" + secret + " \\'x' sslmode=disable", nil, true},
		{"mysql url userinfo", "--dsn", "mysql://root:" + secret + "@" + at + "/test", nil, true},
		{"mysql url password=", "--dsn", "mysql://root@" + at + "/test?password=" + secret, nil, true},
		{"mysql driver DSN", "--dsn", "root:" + secret + "@tcp(" + at + ")/test?parseTime=true", nil, true},
		{"redis userinfo", "--redis", "redis://:" + secret + "@" + at + "/0", nil, true},
		{"rediss user and password", "--redis", "rediss://app:" + secret + "@" + at + "/0", nil, true},
		{"redis password=", "--redis", "redis://" + at + "/0?password=" + secret, nil, true},
		{"sqlite file: auth", "--dsn", "file:/nonexistent/dir/x.db?_auth_pass=" + secret, nil, false},
	}
}

// malformedCases do not parse: what is masked is a guess, and the guess
// errs on the side of masking more.
func malformedCases() []redactCase {
	return []redactCase{
		{"bad escape", "--dsn", "postgres://app:" + secret + "@127.0.0.1:5432/db%zz", nil, true},
		{"unclosed bracket", "--dsn", "postgres://app:" + secret + "@[::1/db", nil, true},
		{"unescaped @ in password", "--dsn", "postgres://app:a@" + secret + "@127.0.0.1:1/db", nil, true},
		{"keyword/value unterminated quote", "--dsn", "host=127.0.0.1 password='" + secret, nil, true},
		{"mysql url without database", "--dsn", "mysql://root:" + secret + "@127.0.0.1:3306", nil, false},
		{"mysql driver DSN without /", "--dsn", "root:" + secret + "@tcp(127.0.0.1:3306)", nil, false},
		{"redis unclosed bracket", "--redis", "redis://:" + secret + "@[::1/0", nil, true},
		{"DSN without its flag", "", "", []string{"stats", "postgres://app:" + secret + "@127.0.0.1:1/db"}, true},
		{"DSN in another flag", "", "", []string{"--table=postgres://app:" + secret + "@127.0.0.1:1/db", "--dsn", "sqlite:///nonexistent/x.db", "stats"}, false},
	}
}

// badLoginCases reach the real servers with a password they refuse: a
// role PostgreSQL does not know (it trusts every known one), root with a
// password MariaDB's root does not have, a Redis ACL user that does not
// exist.
func badLoginCases(t *testing.T) []redactCase {
	testPostgres(t)
	testMySQL(t)
	testRedis(t)
	pg, err := url.Parse(postgresDSN())
	require.NoError(t, err)
	pg.User = url.UserPassword("nosuchrole", secret)
	my, err := mysql.ParseDSN(mysqlDSN())
	require.NoError(t, err)
	return []redactCase{
		{"postgres unknown role", "--dsn", pg.String(), nil, true},
		{"postgres unknown role, keyword/value", "--dsn", "host=" + pg.Hostname() + " port=" + pg.Port() + " user=nosuchrole password='" + secret + "' dbname=test sslmode=disable", nil, true},
		{"mariadb wrong root password", "--dsn", "mysql://root:" + secret + "@" + my.Addr + "/" + my.DBName, nil, true},
		{"mariadb wrong root password=", "--dsn", "mysql://root@" + my.Addr + "/" + my.DBName + "?password=" + secret, nil, true},
		{"mariadb unknown user, driver DSN", "--dsn", "nosuchuser:" + secret + "@tcp(" + my.Addr + ")/" + my.DBName, nil, true},
		{"redis unknown user", "--redis", "redis://nosuchuser:" + secret + "@" + redisAddr() + "/0", nil, true},
	}
}

// A password never appears in idemctl's output, whatever the DSN's form
// and whatever fails: a refused connection, a refused login, a DSN that
// does not parse. Each DSN goes in by flag and by environment variable.
func TestNoSecretInAnyOutput(t *testing.T) {
	for _, group := range []struct {
		name  string
		cases func(*testing.T) []redactCase
	}{
		{"refused", func(*testing.T) []redactCase { return refusedCases() }},
		{"malformed", func(*testing.T) []redactCase { return malformedCases() }},
		{"bad login", badLoginCases},
	} {
		t.Run(group.name, func(t *testing.T) {
			for _, c := range group.cases(t) {
				t.Run(c.name, func(t *testing.T) {
					t.Parallel()
					runs := [][]string{c.args}
					var envs [][]string = [][]string{nil}
					if c.flag != "" {
						runs = [][]string{{c.flag, c.dsn, "--connect-timeout", "5s", "stats"}, {c.flag + "=" + c.dsn, "stats"}, {"--connect-timeout", "5s", "stats"}}
						env := "IDEMCTL_DSN="
						if c.flag == "--redis" {
							env = "IDEMCTL_REDIS="
						}
						envs = [][]string{nil, nil, {env + c.dsn}}
					}
					for i, args := range runs {
						r := idemctl(t, envs[i], "", args...)
						out := r.stdout + r.stderr
						require.NotEqual(t, 0, r.code, "%v: %s", args, out)
						require.NotEmpty(t, r.stderr, "%v", args)
						for _, spelling := range []string{secret, strings.ToLower(secret), url.QueryEscape(secret)} {
							require.NotContains(t, out, spelling, "%v", args)
						}
						if c.echoed {
							require.Contains(t, r.stderr, "xxxxx", "%v: the DSN is quoted, masked", args)
						}
					}
				})
			}
		})
	}
}
