package main

import (
	"context"
	"errors"
	"io"
	"net"
	"net/url"
	"sync"
)

// delayProxy forwards loopback connections to a server through a
// roundTrips dialer, so that a client the harness does not dial itself
// (pgbench, for F) has its round trips counted and delayed like the
// harness's own. It adds a loopback hop of its own: use it only when the
// delay (-rtt) dwarfs one.
type delayProxy struct {
	ln    net.Listener
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

// startProxy listens on a free loopback port and forwards each
// connection to addr through rt.
func startProxy(rt *roundTrips, addr string) (*delayProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &delayProxy{ln: ln, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			p.wg.Add(1)
			go func() { defer p.wg.Done(); p.forward(rt, client, addr) }()
		}
	}()
	return p, nil
}

// addr is the address clients connect to.
func (p *delayProxy) addr() string { return p.ln.Addr().String() }

func (p *delayProxy) forward(rt *roundTrips, client net.Conn, addr string) {
	server, err := rt.dial(context.Background(), "tcp", addr)
	if err != nil {
		_ = client.Close()
		return
	}
	if !p.track(client, server) {
		return
	}
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		done <- struct{}{}
	}
	go pipe(server, client) // requests: the server side counts and delays them
	go pipe(client, server) // answers
	<-done
	_ = client.Close()
	_ = server.Close()
	<-done
	p.mu.Lock()
	delete(p.conns, client)
	delete(p.conns, server)
	p.mu.Unlock()
}

// track registers a connection pair for close; false (both closed) if
// the proxy is closing.
func (p *delayProxy) track(client, server net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil {
		_ = client.Close()
		_ = server.Close()
		return false
	}
	p.conns[client], p.conns[server] = struct{}{}, struct{}{}
	return true
}

// close stops listening, closes every forwarded connection and waits
// for the forwarding goroutines.
func (p *delayProxy) close() error {
	err := p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

// dsnWithAddr points a libpq connection string (URL or key=value) at
// addr (host:port).
func dsnWithAddr(dsn, addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", err
	}
	if u, err := url.Parse(dsn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		u.Host = addr
		return u.String(), nil
	}
	// key=value: a later keyword wins.
	return dsn + " host=" + host + " port=" + port, nil
}
