package process

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"golang.org/x/time/rate"
)

// Network timeouts of every service process, so a silent peer (a
// partition that sends no reset, a host gone without closing) is noticed
// within a stated time instead of the OS's two-hour keepalive default.
// docs/operating.md, "Configuration", lists what each bounds.
const (
	// PGConnectTimeout bounds opening a PostgreSQL connection (TCP, TLS,
	// SCRAM), unless DATABASE_URL sets connect_timeout.
	PGConnectTimeout = 5 * time.Second
	// PGKeepAliveIdle, PGKeepAliveInterval and PGKeepAliveCount are TCP
	// keepalives on both ends of every PostgreSQL connection (client: the
	// dialer; server: tcp_keepalives_idle/interval/count, PostgreSQL docs
	// "Connection Settings"): an idle connection whose peer is gone is
	// closed within idle + interval × count = 8 s.
	PGKeepAliveIdle     = 5 * time.Second
	PGKeepAliveInterval = time.Second
	PGKeepAliveCount    = 3
	// PGUserTimeout is the server's tcp_user_timeout (Linux TCP_USER_TIMEOUT,
	// RFC 5482): a connection whose sent data stays unacknowledged that
	// long is closed, which keepalives (idle connections only) do not cover.
	PGUserTimeout = 8 * time.Second
	// PGStatementTimeout is statement_timeout: no statement of a service
	// runs longer.
	PGStatementTimeout = time.Minute
	// PGIdleInTransactionTimeout is idle_in_transaction_session_timeout: a
	// session whose client went silent inside a transaction is ended and
	// its row locks freed. Above the relay's PubAck wait (10 s), the
	// longest a transaction of ours waits on something else.
	PGIdleInTransactionTimeout = 30 * time.Second
	// NATSPingInterval and NATSMaxPingsOut: a NATS server that stops
	// answering pings is taken as gone, and reconnected to, after
	// interval × (max + 1) = 8 s at most (nats.go's defaults: 2 min × 2).
	NATSPingInterval = 2 * time.Second
	NATSMaxPingsOut  = 3
	// NATSDialTimeout bounds opening a NATS connection.
	NATSDialTimeout = 5 * time.Second
	// PGConnectRate is how many new PostgreSQL connections per second a
	// service's pool opens at most once its burst (the pool's MaxConns,
	// so a cold start fills the pool at once) is spent: while PostgreSQL
	// refuses or resets (a failover, a restart, a firewall), every
	// transaction of every inbox handler would otherwise open a
	// connection at once, hundreds a second, each a backend forked and
	// ended, and the server just back would be kept busy by them.
	PGConnectRate = 20
)

// netSettings sets the network timeouts above on a PostgreSQL pool's
// configuration: the server's with SET right after each connection is
// made (chained after cfg.AfterConnect, so they hold for the session's
// life; not as startup parameters, which a pooler may refuse: PgBouncer
// 1.18 answers "unsupported startup parameter" for every one it does not
// track), the client's on its dialer. A setting DATABASE_URL already
// gives (a parameter, options=-c ... or connect_timeout) is kept.
func netSettings(cfg *pgxpool.Config) {
	cc := cfg.ConnConfig
	ms := func(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }
	var sets []string
	for _, kv := range [][2]string{
		{"tcp_keepalives_idle", strconv.Itoa(int(PGKeepAliveIdle.Seconds()))},
		{"tcp_keepalives_interval", strconv.Itoa(int(PGKeepAliveInterval.Seconds()))},
		{"tcp_keepalives_count", strconv.Itoa(PGKeepAliveCount)},
		{"tcp_user_timeout", ms(PGUserTimeout)},
		{"statement_timeout", ms(PGStatementTimeout)},
		{"idle_in_transaction_session_timeout", ms(PGIdleInTransactionTimeout)},
	} {
		k, v := kv[0], kv[1]
		if _, ok := cc.RuntimeParams[k]; !ok && !strings.Contains(cc.RuntimeParams["options"], k+"=") {
			sets = append(sets, "SET "+k+" = "+v)
		}
	}
	if len(sets) > 0 {
		stmt, prev := strings.Join(sets, "; "), cfg.AfterConnect
		cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
			if prev != nil {
				if err := prev(ctx, c); err != nil {
					return err
				}
			}
			if _, err := c.Exec(ctx, stmt); err != nil {
				return fmt.Errorf("postgres: network timeouts: %w", err)
			}
			return nil
		}
	}
	if cc.ConnectTimeout == 0 {
		cc.ConnectTimeout = PGConnectTimeout
	}
	d := &net.Dialer{KeepAliveConfig: net.KeepAliveConfig{
		Enable: true, Idle: PGKeepAliveIdle, Interval: PGKeepAliveInterval, Count: PGKeepAliveCount,
	}}
	cc.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		return d.DialContext(ctx, network, addr)
	}
}

// connectPacing paces the pool's new connections (PGConnectRate a second,
// a burst of cfg.MaxConns; chained before cfg.BeforeConnect): a
// connection beyond them waits for its turn, within the caller's context
// (an acquire whose deadline comes first fails at once, with
// rate.Limiter's error).
func connectPacing(cfg *pgxpool.Config) {
	lim := rate.NewLimiter(PGConnectRate, int(max(cfg.MaxConns, 1)))
	prev := cfg.BeforeConnect
	cfg.BeforeConnect = func(ctx context.Context, cc *pgx.ConnConfig) error {
		if err := lim.Wait(ctx); err != nil {
			return fmt.Errorf("postgres: waiting for a turn to connect (at most %d new connections a second): %w", PGConnectRate, err)
		}
		if prev != nil {
			return prev(ctx, cc)
		}
		return nil
	}
}

// natsNetOptions are the NATS client's timeouts above.
func natsNetOptions() []nats.Option {
	return []nats.Option{nats.PingInterval(NATSPingInterval), nats.MaxPingsOutstanding(NATSMaxPingsOut), nats.Timeout(NATSDialTimeout)}
}
