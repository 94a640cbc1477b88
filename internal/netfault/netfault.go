// Package netfault puts a real TCP proxy between a process and a server
// (PostgreSQL, NATS, a company) and breaks the network between them on
// purpose: a cut with resets, a blackhole with no reset, added latency, a
// stream closed half-way through an answer. It is Shopify's toxiproxy
// (github.com/Shopify/toxiproxy/v2) used as a library, in-process, listening
// on 127.0.0.1 only, for tests and for chaos.
//
// Toxics apply to the connections open when they are added and to every
// connection made while they are in force; [Proxy.Heal] removes them all.
// A connection whose first bytes have not yet crossed the proxy when a
// fault is added may escape it (toxiproxy sets a connection's chain up
// asynchronously): tests exchange a first message, as a pool's connection
// has, before adding one.
package netfault

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
)

// Proxy forwards TCP connections from [Proxy.Addr] to its upstream, through
// the faults in force. It is safe for concurrent use.
type Proxy struct {
	name string
	p    *toxiproxy.Proxy

	mu     sync.Mutex
	closed bool
	// reject listens on the proxy's address instead of toxiproxy while a
	// [Proxy.Reset] is in force (nil otherwise); rejected is closed once
	// its accept loop has returned.
	reject   net.Listener
	rejected chan struct{}
}

// ErrClosed is returned by a fault asked of a closed proxy.
var ErrClosed = errors.New("netfault: proxy closed")

// Start starts a proxy named name (it names the proxy in errors) that
// listens on 127.0.0.1 at a free port and forwards to upstream
// ("host:port"). Errors: upstream is not host:port, or no port is free.
func Start(name, upstream string) (*Proxy, error) {
	if _, _, err := net.SplitHostPort(upstream); err != nil {
		return nil, fmt.Errorf("netfault: upstream %q: want host:port: %w", upstream, err)
	}
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, name, "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		return nil, fmt.Errorf("netfault: proxy %s: %w", name, err)
	}
	return &Proxy{name: name, p: p}, nil
}

// Addr returns the address clients dial instead of the upstream
// ("127.0.0.1:<port>").
func (p *Proxy) Addr() string { return p.p.Listen }

// Host is the host of [Proxy.Addr] (127.0.0.1).
func (p *Proxy) Host() string { h, _, _ := net.SplitHostPort(p.Addr()); return h }

// Port is the port of [Proxy.Addr].
func (p *Proxy) Port() uint16 {
	_, s, _ := net.SplitHostPort(p.Addr())
	var port uint16
	_, _ = fmt.Sscan(s, &port)
	return port
}

// Blackhole drops every byte in both directions and closes nothing, as a
// partition does that sends no reset: connections stay open, requests go
// unanswered, new connections are accepted and then hear nothing. (Through
// the proxy the TCP peer is the proxy, which acknowledges what it drops,
// so TCP keepalives and TCP_USER_TIMEOUT on either side do not see this
// blackhole; only the two ends' own timeouts do.) A side that closes its
// connection still closes the proxy's other half.
func (p *Proxy) Blackhole() error {
	return p.both("blackhole", "timeout", map[string]any{"timeout": 0})
}

// Reset cuts every connection: an open connection is closed at once, and
// a new one is accepted and reset before its first byte (SO_LINGER 0, a
// TCP RST), as a host or firewall that rejects does; no new connection
// reaches the upstream until [Proxy.Heal].
//
// It does not use toxiproxy's reset_peer toxic: toxiproxy dials the
// upstream for every connection it accepts, toxics or not, so a client
// reconnecting in a loop through a reset_peer cut makes the upstream
// accept (PostgreSQL: fork a backend for) every attempt. A pool retrying
// hundreds of times a second left PostgreSQL taking 9 s or more to answer
// anyone once healed, a flood no real rejecting firewall lets through.
func (p *Proxy) Reset() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	if p.reject != nil {
		return nil
	}
	addr := p.p.Listen
	p.p.Stop() // closes its listener and every connection it carries
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return errors.Join(fmt.Errorf("netfault: proxy %s: reset: listen %s: %w", p.name, addr, err), p.p.Start())
	}
	p.reject, p.rejected = ln, make(chan struct{})
	go func(done chan struct{}) {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0) // close sends a RST
			}
			_ = c.Close()
		}
	}(p.rejected)
	return nil
}

// endReset gives the proxy's address back to toxiproxy after a
// [Proxy.Reset]; p.mu is held.
func (p *Proxy) endReset() error {
	if p.reject == nil {
		return nil
	}
	_ = p.reject.Close()
	<-p.rejected
	p.reject, p.rejected = nil, nil
	if err := p.p.Start(); err != nil {
		return fmt.Errorf("netfault: proxy %s: heal: listen %s again: %w", p.name, p.p.Listen, err)
	}
	return nil
}

// Latency delays every chunk by d (± jitter, uniform) in each direction,
// so a round trip takes 2 × d more. Errors: d or jitter negative.
func (p *Proxy) Latency(d, jitter time.Duration) error {
	if d < 0 || jitter < 0 {
		return fmt.Errorf("netfault: latency %s ± %s: want both >= 0", d, jitter)
	}
	return p.both("latency", "latency", map[string]any{"latency": d.Milliseconds(), "jitter": jitter.Milliseconds()})
}

// HalfClose lets n more bytes through towards the client (downstream) on
// each open connection, and n bytes from the start on a new one, then
// closes it: the client sees an answer stop half-way and the connection
// end, while what it sent had gone through. Errors: n < 1.
func (p *Proxy) HalfClose(n int64) error {
	if n < 1 {
		return fmt.Errorf("netfault: half-close after %d bytes: want >= 1", n)
	}
	return p.add("half_close_downstream", "limit_data", "downstream", map[string]any{"bytes": n})
}

// Heal removes every fault; new connections carry again (after a reset,
// on the same port). Connections closed meanwhile stay closed, data a blackhole dropped stays lost, and
// the connections a blackhole held are closed (toxiproxy's timeout toxic
// closes them when it is removed), as a peer's timeout would have.
func (p *Proxy) Heal() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	p.p.Toxics.ResetToxics(context.Background())
	return p.endReset()
}

// Close stops the proxy: it stops listening and closes every connection
// (a FIN to both sides), which unblocks a client stuck on a blackholed
// connection. It is idempotent.
func (p *Proxy) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.closed = true
	if p.reject != nil {
		_ = p.reject.Close()
		<-p.rejected
	}
	p.p.Toxics.ResetToxics(context.Background())
	p.p.Stop()
}

func (p *Proxy) both(name, typ string, attrs map[string]any) error {
	if err := p.add(name+"_upstream", typ, "upstream", attrs); err != nil {
		return err
	}
	return p.add(name+"_downstream", typ, "downstream", attrs)
}

func (p *Proxy) add(name, typ, stream string, attrs map[string]any) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	if err := p.endReset(); err != nil { // a new fault replaces a reset
		return err
	}
	body, err := json.Marshal(map[string]any{"name": name, "type": typ, "stream": stream, "toxicity": 1.0, "attributes": attrs})
	if err != nil {
		return err
	}
	if _, err := p.p.Toxics.AddToxicJson(bytes.NewReader(body)); err != nil {
		return fmt.Errorf("netfault: proxy %s: %s: %w", p.name, name, err)
	}
	return nil
}
