package main

import (
	"encoding/binary"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"
)

// requireOneLine checks that idemctl failed with exactly one line on
// stderr and nothing on stdout.
func requireOneLine(t *testing.T, r result) {
	t.Helper()
	require.Equal(t, 1, r.code, r.stderr)
	require.Empty(t, r.stdout)
	require.Equal(t, 1, strings.Count(r.stderr, "\n"), "one line:\n%s", r.stderr)
	require.True(t, strings.HasPrefix(r.stderr, "idemctl: "), r.stderr)
}

// A refused port is said once. PostgreSQL's default sslmode=prefer dials
// twice (with TLS, then without) and go-redis retries its dial and logs
// every retry; each store's error is one line naming the dial.
func TestDialFailurePrintsOneLine(t *testing.T) {
	const at = "127.0.0.1:1"
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"postgres sslmode=prefer", []string{"--dsn", "postgres://postgres@" + at + "/test"}},
		{"postgres keyword/value", []string{"--dsn", "host=127.0.0.1 port=1 user=postgres dbname=test"}},
		{"mysql", []string{"--dsn", "mysql://root@" + at + "/test"}},
		{"redis", []string{"--redis", "redis://" + at + "/0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := idemctl(t, nil, "", append(tc.args, "--connect-timeout", "5s", "stats")...)
			requireOneLine(t, r)
			require.Contains(t, r.stderr, " does not answer: dial tcp "+at+": connect: connection refused\n")
			require.Equal(t, 1, strings.Count(r.stderr, at+":"), "the address once in the cause:\n%s", r.stderr)
		})
	}
}

// rediss:// against the tests' plain Redis: TLS mismatch, use redis://
// (it used to say only "context deadline exceeded").
func TestRedissAgainstPlainRedis(t *testing.T) {
	testRedis(t) // skips (or fails under CI) without Redis
	r := idemctl(t, nil, "", "--redis", "rediss://"+redisAddr()+"/0", "--connect-timeout", "2s", "stats")
	requireOneLine(t, r)
	require.Contains(t, r.stderr, "TLS mismatch: rediss:// asks for TLS but the Redis server at "+redisAddr()+" speaks plain RESP; use redis://")
	require.NotContains(t, r.stderr, "deadline")
}

// redis:// against a server that speaks only TLS (an HTTPS server stands
// in for a Redis behind a TLS-only port): TLS mismatch, use rediss://.
func TestRedisAgainstTLSServer(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.NotFoundHandler())
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the plain client's bytes are a handshake error
	srv.StartTLS()
	t.Cleanup(srv.Close)
	addr := srv.Listener.Addr().String()
	r := idemctl(t, nil, "", "--redis", "redis://"+addr+"/0", "--connect-timeout", "5s", "stats")
	requireOneLine(t, r)
	require.Contains(t, r.stderr, "TLS mismatch: redis:// asks for plain RESP but the server at "+addr+" speaks TLS; use rediss://")
}

// fakePostgres listens for PostgreSQL clients, refuses SSL and answers a
// startup message with a FATAL error (SQLSTATE 28000) saying fatal; it
// returns its address.
func fakePostgres(t *testing.T, fatal string) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	t.Cleanup(func() {
		_ = ln.Close()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer conn.Close()
				_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
				servePostgresWithoutSSL(conn, fatal)
			})
		}
	})
	return ln.Addr().String()
}

func servePostgresWithoutSSL(conn net.Conn, fatal string) {
	for {
		var hdr [8]byte
		if _, err := io.ReadFull(conn, hdr[:]); err != nil {
			return
		}
		switch code := binary.BigEndian.Uint32(hdr[4:]); code {
		case 80877103, 80877104: // SSLRequest, GSSENCRequest
			if _, err := conn.Write([]byte("N")); err != nil {
				return
			}
			continue
		}
		n := binary.BigEndian.Uint32(hdr[:4])
		if _, err := io.CopyN(io.Discard, conn, int64(n)-8); err != nil {
			return
		}
		var body []byte
		for _, f := range []string{"SFATAL", "VFATAL", "C28000", "M" + fatal} {
			body = append(append(body, f...), 0)
		}
		body = append(body, 0)
		msg := binary.BigEndian.AppendUint32([]byte{'E'}, uint32(len(body)+4))
		_, _ = conn.Write(append(msg, body...))
		return
	}
}

// sslmode=require against a PostgreSQL server without SSL, and a plain
// connection to one that accepts this login only over TLS: TLS mismatch,
// with the sslmode to use.
func TestPostgresTLSMismatch(t *testing.T) {
	addr := fakePostgres(t, `no pg_hba.conf entry for host "127.0.0.1", user "postgres", database "test", no encryption`)
	r := idemctl(t, nil, "", "--dsn", "postgres://postgres@"+addr+"/test?sslmode=require", "--connect-timeout", "5s", "stats")
	requireOneLine(t, r)
	require.Contains(t, r.stderr, "TLS mismatch: sslmode asks for TLS but the PostgreSQL server at "+addr+" does not support it (it refused SSL); use sslmode=disable")

	for _, mode := range []string{"disable", "prefer"} {
		r = idemctl(t, nil, "", "--dsn", "postgres://postgres@"+addr+"/test?sslmode="+mode, "--connect-timeout", "5s", "stats")
		requireOneLine(t, r)
		require.Contains(t, r.stderr, "TLS mismatch: the PostgreSQL server at "+addr+" accepts this login only over TLS (pg_hba.conf hostssl) and the DSN connects without it; use sslmode=require", mode)
	}
}

// tls=true against the tests' MariaDB, which serves no TLS: TLS mismatch.
func TestMySQLTLSMismatch(t *testing.T) {
	testMySQL(t) // skips (or fails under CI) without MariaDB
	cfg, err := mysql.ParseDSN(mysqlDSN())
	require.NoError(t, err)
	r := idemctl(t, nil, "", "--dsn", "mysql://root@"+cfg.Addr+"/"+cfg.DBName+"?tls=true", "--connect-timeout", "5s", "stats")
	if r.code == 0 || strings.Contains(r.stderr, "certificate") {
		t.Skip("the MariaDB under test serves TLS")
	}
	requireOneLine(t, r)
	require.Contains(t, r.stderr, "TLS mismatch: tls= asks for TLS but the MySQL server at "+cfg.Addr+" does not support it; drop tls=")
}

// Under sslmode=prefer a server without SSL is no mismatch: the plain
// attempt's error is the answer, said once, without the refused TLS one.
func TestPostgresPreferWithoutSSL(t *testing.T) {
	addr := fakePostgres(t, `role "nosuchrole" does not exist`)
	r := idemctl(t, nil, "", "--dsn", "postgres://nosuchrole@"+addr+"/test?sslmode=prefer", "--connect-timeout", "5s", "stats")
	requireOneLine(t, r)
	require.Contains(t, r.stderr, `FATAL: role "nosuchrole" does not exist (SQLSTATE 28000)`)
	require.NotContains(t, r.stderr, "TLS")
}

// A MySQL server with require_secure_transport=ON refuses a plain login
// with error 3159; that is a TLS mismatch too. (The tests' MariaDB does
// not require TLS, so the server's error is built here.)
func TestMySQLRequiresTLS(t *testing.T) {
	err := mysqlConnectError("mysql database mysql://app@db:3306/app", "db:3306", &mysql.MySQLError{Number: 3159,
		Message: "Connections using insecure transport are prohibited while --require_secure_transport=ON."})
	require.EqualError(t, err, "mysql database mysql://app@db:3306/app: TLS mismatch: the MySQL server at db:3306 requires TLS (require_secure_transport); add tls=true to the DSN (tls=skip-verify for a self-signed certificate)")
	err = mysqlConnectError("mysql database x", "db:3306", &mysql.MySQLError{Number: 1045, Message: "Access denied for user 'app'@'10.0.0.1'"})
	require.EqualError(t, err, "mysql database x does not answer: Error 1045: Access denied for user 'app'@'10.0.0.1'")
}

// Several distinct failed attempts (several hosts) are one line each.
func TestNotAnsweringSeveralAttempts(t *testing.T) {
	err := notAnswering("postgres database x", []string{"dial tcp 10.0.0.1:5432: i/o timeout", "dial tcp 10.0.0.2:5432: connect: connection refused"})
	require.EqualError(t, err, "postgres database x does not answer:\n\tdial tcp 10.0.0.1:5432: i/o timeout\n\tdial tcp 10.0.0.2:5432: connect: connection refused")
}

// Two PostgreSQL hosts that refuse: one line for each failed dial, each
// once though sslmode=prefer dials each twice.
func TestDialFailureOneLinePerHost(t *testing.T) {
	r := idemctl(t, nil, "", "--dsn", "postgres://postgres@127.0.0.1:1,127.0.0.1:2/test", "--connect-timeout", "5s", "stats")
	require.Equal(t, 1, r.code, r.stderr)
	require.Equal(t, "idemctl: postgres database postgres://postgres@127.0.0.1:1,127.0.0.1:2/test does not answer:\n"+
		"\tdial tcp 127.0.0.1:1: connect: connection refused\n"+
		"\tdial tcp 127.0.0.1:2: connect: connection refused\n", r.stderr)
}
