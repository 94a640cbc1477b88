package netfault_test

import (
	"bufio"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/internal/netfault"
)

// echo serves lines back, each prefixed by what the server received so
// far on the connection; every line received is also sent on got, and
// accepts counts the connections it accepted.
func echo(t *testing.T) (addr string, got chan string, accepts *atomic.Int64) {
	t.Helper()
	got = make(chan string, 100)
	accepts = new(atomic.Int64)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepts.Add(1)
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				seen := ""
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					got <- line[:len(line)-1]
					seen += line[:len(line)-1]
					if _, err := io.WriteString(c, seen+"\n"); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String(), got, accepts
}

func dial(t *testing.T, p *netfault.Proxy) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c, bufio.NewReader(c)
}

func say(t *testing.T, c net.Conn, r *bufio.Reader, line string) (string, error) {
	t.Helper()
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return "", err
	}
	return r.ReadString('\n')
}

func proxy(t *testing.T) (*netfault.Proxy, chan string) {
	p, got, _ := proxyCounting(t)
	return p, got
}

func proxyCounting(t *testing.T) (*netfault.Proxy, chan string, *atomic.Int64) {
	t.Helper()
	addr, got, accepts := echo(t)
	p, err := netfault.Start("echo", addr)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	require.Equal(t, "127.0.0.1", p.Host())
	return p, got, accepts
}

func TestProxy(t *testing.T) {
	t.Parallel()
	t.Run("a blackhole drops what is sent and closes nothing until healed", func(t *testing.T) {
		t.Parallel()
		p, seen := proxy(t)
		c, r := dial(t, p)
		got, err := say(t, c, r, "a")
		require.NoError(t, err)
		require.Equal(t, "a\n", got)
		require.Equal(t, "a", <-seen)
		require.NoError(t, p.Blackhole())
		_, err = io.WriteString(c, "b\n") // taken by the proxy, dropped
		require.NoError(t, err, "no reset: the write is taken")
		require.NoError(t, p.Heal())
		_, err = r.ReadString('\n')
		require.Error(t, err, "toxiproxy closes what the blackhole held when it is removed")
		c3, r3 := dial(t, p)
		got, err = say(t, c3, r3, "c")
		require.NoError(t, err)
		require.Equal(t, "c\n", got)
		require.Equal(t, "c", <-seen, "the server never saw b")
	})
	t.Run("a reset closes the open connections and rejects new ones before they reach the server", func(t *testing.T) {
		t.Parallel()
		p, _, accepts := proxyCounting(t)
		addr := p.Addr()
		c, r := dial(t, p)
		_, err := say(t, c, r, "a")
		require.NoError(t, err)
		require.NoError(t, p.Reset())
		require.NoError(t, p.Reset(), "a reset in force is kept")
		_, err = say(t, c, r, "b")
		require.Error(t, err, "cut")
		for range 50 { // a client reconnecting in a loop
			c2, err := net.Dial("tcp", p.Addr())
			if err != nil {
				continue // reset before connect returned: cut too
			}
			_, err = say(t, c2, bufio.NewReader(c2), "x")
			_ = c2.Close()
			require.Error(t, err, "a new connection is cut too")
		}
		require.EqualValues(t, 1, accepts.Load(), "no connection made during the reset reached the server")
		require.NoError(t, p.Heal())
		require.Equal(t, addr, p.Addr(), "healed on the same port")
		c3, r3 := dial(t, p)
		got, err := say(t, c3, r3, "y")
		require.NoError(t, err)
		require.Equal(t, "y\n", got)
		require.NoError(t, p.Reset())
		require.NoError(t, p.Blackhole(), "a new fault replaces the reset")
		c4, _ := dial(t, p)
		_, err = io.WriteString(c4, "z\n")
		require.NoError(t, err, "a blackhole takes the write")
		require.NoError(t, p.Heal())
	})
	t.Run("latency makes a round trip take at least twice the delay", func(t *testing.T) {
		t.Parallel()
		p, _ := proxy(t)
		c, r := dial(t, p)
		_, err := say(t, c, r, "x") // the connection is set up in the proxy
		require.NoError(t, err)
		require.NoError(t, p.Latency(100*time.Millisecond, 0))
		start := time.Now()
		got, err := say(t, c, r, "a")
		require.NoError(t, err)
		require.Equal(t, "xa\n", got)
		require.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond)
		require.Error(t, p.Latency(-time.Second, 0))
	})
	t.Run("a half-close lets n bytes of the answer through, then ends the connection", func(t *testing.T) {
		t.Parallel()
		p, _ := proxy(t)
		c, r := dial(t, p)
		_, err := say(t, c, r, "a") // the connection is set up in the proxy
		require.NoError(t, err)
		require.NoError(t, p.HalfClose(3))
		_, err = io.WriteString(c, "hello world\n")
		require.NoError(t, err)
		got, err := io.ReadAll(r)
		require.NoError(t, err, "closed, not reset")
		require.Equal(t, "ahe", string(got), "3 bytes of the answer, then the end")
		require.Error(t, p.HalfClose(0))
	})
	t.Run("close unblocks a client waiting on a blackholed connection", func(t *testing.T) {
		t.Parallel()
		p, _ := proxy(t)
		c, r := dial(t, p)
		_, err := say(t, c, r, "a") // the connection is set up in the proxy
		require.NoError(t, err)
		require.NoError(t, p.Blackhole())
		_, err = io.WriteString(c, "b\n")
		require.NoError(t, err)
		done := make(chan error, 1)
		go func() { _, err := r.ReadString('\n'); done <- err }()
		p.Close()
		require.Error(t, <-done)
		require.ErrorIs(t, p.Blackhole(), netfault.ErrClosed)
		p.Close()
	})
}
