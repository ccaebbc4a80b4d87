package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
	goredis "github.com/redis/go-redis/v9"
)

// The drivers log what they retry: go-redis a line per failed dial of
// every retry, go-sql-driver/mysql a line per broken connection. idemctl
// reports the error they return instead, once, so their logs are off.
func init() {
	goredis.SetLogger(quietLogger{})
	_ = mysql.SetLogger(quietLogger{})
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}
func (quietLogger) Print(...any)                           {}

// notAnswering is the error of a store that could not be reached or
// refused the connection: "<what> does not answer: <cause>", each failed
// attempt said once, on a line of its own when there are several (one
// host tried with and without TLS, or several hosts).
func notAnswering(what string, causes []string) error {
	if len(causes) == 1 {
		return fmt.Errorf("%s does not answer: %s", what, causes[0])
	}
	return fmt.Errorf("%s does not answer:\n\t%s", what, strings.Join(causes, "\n\t"))
}

// tlsMismatch is the error of a store that answered, but not in the
// protocol the DSN asked for: TLS against a plain server, or plain
// against a TLS one. It names the fix.
func tlsMismatch(what, why, fix string) error {
	return fmt.Errorf("%s: TLS mismatch: %s; %s", what, why, fix)
}

// isNotTLS reports an error of a TLS client that got bytes that are not
// TLS back: the server speaks the plain protocol on that port.
func isNotTLS(err error) bool {
	var rh tls.RecordHeaderError
	return errors.As(err, &rh)
}

// postgresConnectError says why PostgreSQL at what (the redacted DSN) did
// not answer. pgconn reports every attempt: each host, and under the
// default sslmode=prefer each host twice, with TLS and without; a refused
// port gives the same dial error twice. Each distinct one is said once.
func postgresConnectError(what string, err error) error {
	var ce *pgconn.ConnectError
	if !errors.As(err, &ce) {
		return notAnswering(what, []string{err.Error()})
	}
	addr := net.JoinHostPort(ce.Config.Host, strconv.Itoa(int(ce.Config.Port)))
	attempts := []error{errors.Unwrap(ce)}
	if joined, ok := attempts[0].(interface{ Unwrap() []error }); ok {
		attempts = joined.Unwrap()
	}
	var (
		causes     []string
		refusedTLS bool
	)
	for _, a := range attempts {
		var (
			pgErr *pgconn.PgError
			opErr *net.OpError
		)
		switch {
		case strings.HasSuffix(a.Error(), "server refused TLS connection"): // pgconn's errors.New
			// A mismatch only if no attempt went without TLS: under
			// sslmode=prefer the plain attempt's outcome is the answer.
			refusedTLS = true
		case isNotTLS(a):
			return tlsMismatch(what, "the DSN asks for TLS but the server at "+addr+" answered without it",
				"use sslmode=disable (or prefer), or enable ssl on the server")
		case errors.As(a, &pgErr) && pgErr.Code == "28000" && strings.Contains(pgErr.Message, "no encryption"):
			return tlsMismatch(what, "the PostgreSQL server at "+addr+" accepts this login only over TLS (pg_hba.conf hostssl) and the DSN connects without it",
				"use sslmode=require")
		case errors.As(a, &opErr):
			// "dial tcp 127.0.0.1:1: connect: connection refused": names
			// the address, without pgconn's copy of it.
			causes = appendNew(causes, opErr.Error())
		default:
			causes = appendNew(causes, a.Error())
		}
	}
	if refusedTLS && len(causes) == 0 {
		return tlsMismatch(what, "sslmode asks for TLS but the PostgreSQL server at "+addr+" does not support it (it refused SSL)",
			"use sslmode=disable (or prefer), or enable ssl on the server")
	}
	return notAnswering(what, causes)
}

// mysqlConnectError says why MySQL at what (the redacted DSN) and addr
// did not answer, naming a TLS mismatch.
func mysqlConnectError(what, addr string, err error) error {
	var my *mysql.MySQLError
	switch {
	case errors.Is(err, mysql.ErrNoTLS):
		return tlsMismatch(what, "tls= asks for TLS but the MySQL server at "+addr+" does not support it",
			"drop tls= (or use tls=preferred), or enable TLS on the server")
	case isNotTLS(err):
		return tlsMismatch(what, "tls= asks for TLS but the server at "+addr+" answered without it",
			"drop tls= (or use tls=preferred), or enable TLS on the server")
	case errors.As(err, &my) && (my.Number == 3159 || strings.Contains(my.Message, "insecure transport")):
		// ER_SECURE_TRANSPORT_REQUIRED: require_secure_transport=ON.
		return tlsMismatch(what, "the MySQL server at "+addr+" requires TLS (require_secure_transport)",
			"add tls=true to the DSN (tls=skip-verify for a self-signed certificate)")
	}
	return notAnswering(what, []string{err.Error()})
}

// redisConnectError says why Redis at what (the redacted URL) did not
// answer the PING, naming a TLS mismatch. A rediss:// client talking to a
// plain server usually waits until the timeout (the server waits for a
// line end that the TLS hello does not contain), and a plain client
// talking to a TLS server reads EOF: what the server speaks is found by
// asking it once more, in the other protocol.
func redisConnectError(ctx context.Context, what string, opts *goredis.Options, timeout time.Duration, err error) error {
	var (
		opErr *net.OpError
		reply goredis.Error // the server answered in RESP: no mismatch
	)
	dialFailed := errors.As(err, &opErr) && opErr.Op == "dial"
	if !dialFailed && !errors.As(err, &reply) && ctx.Err() == nil {
		probeCtx, cancel := context.WithTimeout(ctx, min(timeout, 3*time.Second))
		defer cancel()
		switch {
		case opts.TLSConfig != nil && (isNotTLS(err) || speaksRESP(probeCtx, opts.Addr)):
			return tlsMismatch(what, "rediss:// asks for TLS but the Redis server at "+opts.Addr+" speaks plain RESP",
				"use redis://, or enable TLS on the server (tls-port)")
		case opts.TLSConfig == nil && speaksTLS(probeCtx, opts.Addr):
			return tlsMismatch(what, "redis:// asks for plain RESP but the server at "+opts.Addr+" speaks TLS",
				"use rediss://")
		}
	}
	return notAnswering(what, []string{err.Error()})
}

// speaksRESP reports whether the server at addr answers a plain PING
// with a RESP reply (+PONG, or an error such as -NOAUTH).
func speaksRESP(ctx context.Context, addr string) bool {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return false
	}
	defer conn.Close()
	if deadline, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(deadline)
	}
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		return false
	}
	b, err := bufio.NewReader(conn).ReadByte()
	return err == nil && (b == '+' || b == '-')
}

// speaksTLS reports whether the server at addr completes a TLS handshake.
// The certificate is not checked: this only asks which protocol the port
// speaks, and nothing is sent over the connection.
func speaksTLS(ctx context.Context, addr string) bool {
	d := tls.Dialer{Config: &tls.Config{InsecureSkipVerify: true}} //nolint:gosec // a protocol probe, no data
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return false
	}
	_ = conn.Close()
	return true
}

// appendNew appends s to list unless it is there already.
func appendNew(list []string, s string) []string {
	if slices.Contains(list, s) {
		return list
	}
	return append(list, s)
}
