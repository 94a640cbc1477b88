package stack

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"

	"github.com/tripsaga/tripsaga/internal/netfault"
)

// The shapes of a network partition of one service replica
// ([Stack.Cut]), each made with the replica's own TCP proxies
// (internal/netfault) while its peers' network stays whole.
const (
	// CutPostgresBlackhole drops every byte between the replica and
	// PostgreSQL and closes nothing (a partition that sends no reset):
	// its beats stop committing, it fences itself after 3 s
	// (saga.FenceAfter), its lock's session is ended by the server's
	// idle_session_timeout (3.5 s), and a peer takes its leases after
	// the takeover grace.
	CutPostgresBlackhole = "pg-blackhole"
	// CutPostgresReset closes every connection between the replica and
	// PostgreSQL and resets every new one before it reaches PostgreSQL (a
	// TCP RST, as a host or firewall that rejects; netfault's
	// Proxy.Reset): the lock goes with the session at once; the rest is
	// as with a blackhole.
	CutPostgresReset = "pg-reset"
	// CutNATSBlackhole drops every byte between the replica and every
	// NATS server: its relay cannot publish (another replica's relay
	// claims the rows once they are due again), its unacked messages come
	// back to the peers after AckWait, and its client's pings (every 2 s,
	// 3 outstanding) find the connection stale and reconnect once healed.
	// Its PostgreSQL stays whole, so it keeps its leases and finishes the
	// company calls it owns.
	CutNATSBlackhole = "nats-blackhole"
	// CutBothBlackhole is a blackhole from PostgreSQL and NATS at once: the
	// replica is alone with the companies.
	CutBothBlackhole = "pg+nats-blackhole"
)

// CutShapes lists every shape of [Stack.Cut].
var CutShapes = []string{CutPostgresBlackhole, CutPostgresReset, CutNATSBlackhole, CutBothBlackhole} //nolint:gochecknoglobals // read-only

// ErrNoProxies is returned by [Stack.Cut] and [Stack.Heal] on a stack
// started without Config.Partitions.
var ErrNoProxies = errors.New("stack: no network proxies (start the stack with Config.Partitions)")

// replicaNet is one service replica's own proxies: one per PostgreSQL host
// of its role's URL and one per NATS server, and the URLs it is given
// instead of the real ones.
type replicaNet struct {
	pg, nats []*netfault.Proxy
	pgURL    string // DATABASE_URL through pg
	natsURL  string // NATS_URL through nats, comma-separated
}

// startProxies puts a proxy between every service replica and each
// PostgreSQL host of its role's URL, and between it and each NATS server
// (Config.Partitions). Each replica has its own, so [Stack.Cut] can cut
// one alone. The proxies live in the supervisor for the stack's life, on
// fixed ports, so a restarted child gets the same ones and a restarted
// PostgreSQL or NATS node is reached again through them.
func (s *Stack) startProxies() error {
	s.nets = map[string]*replicaNet{}
	for _, in := range s.insts {
		if !slices.Contains(servicesOf(s.cfg), in.process) {
			continue // the simulators and the NATS nodes
		}
		rn := &replicaNet{}
		s.nets[in.name] = rn
		u, err := url.Parse(s.roleURLs[in.process])
		if err != nil || u.Host == "" {
			return fmt.Errorf("stack: Partitions: DATABASE_URL of %s must name its host(s) as host:port to be proxied", in.process)
		}
		var hosts []string
		for i, h := range strings.Split(u.Host, ",") {
			if !strings.Contains(h, ":") {
				h += ":5432"
			}
			p, err := netfault.Start(fmt.Sprintf("%s postgres %d", in.name, i+1), h)
			if err != nil {
				return fmt.Errorf("stack: %w", err)
			}
			rn.pg = append(rn.pg, p)
			hosts = append(hosts, p.Addr())
		}
		u.Host = strings.Join(hosts, ",")
		rn.pgURL = u.String()
		var urls []string
		for i, raw := range strings.Split(s.NATSURL, ",") {
			nu, err := url.Parse(strings.TrimSpace(raw))
			if err != nil || nu.Host == "" {
				return fmt.Errorf("stack: Partitions: NATS URL %q: want nats://host:port", raw)
			}
			p, err := netfault.Start(fmt.Sprintf("%s nats %d", in.name, i+1), nu.Host)
			if err != nil {
				return fmt.Errorf("stack: %w", err)
			}
			rn.nats = append(rn.nats, p)
			nu.Host = p.Addr()
			urls = append(urls, nu.String())
		}
		rn.natsURL = strings.Join(urls, ",")
	}
	return nil
}

// stopProxies closes every proxy (at Stop, after the children).
func (s *Stack) stopProxies() {
	for _, rn := range s.nets {
		for _, p := range slices.Concat(rn.pg, rn.nats) {
			p.Close()
		}
	}
}

// Partitionable names the instances [Stack.Cut] can cut: every service
// replica, none when the stack runs without Config.Partitions.
func (s *Stack) Partitionable() []string {
	var out []string
	for _, in := range s.insts {
		if s.nets[in.name] != nil {
			out = append(out, in.name)
		}
	}
	return out
}

// Cut breaks the network of one service replica ("hotel-2") in shape (one
// of [CutShapes]) until [Stack.Heal]; every other process's network stays
// whole. A cut in force is replaced by the new one. Errors: the stack was
// started without Config.Partitions ([ErrNoProxies]), instance is no
// service replica, shape is unknown.
func (s *Stack) Cut(instance, shape string) error {
	rn, err := s.replicaNet(instance)
	if err != nil {
		return err
	}
	if err := s.Heal(instance); err != nil {
		return err
	}
	var do []func() error
	each := func(ps []*netfault.Proxy, f func(*netfault.Proxy) error) {
		for _, p := range ps {
			do = append(do, func() error { return f(p) })
		}
	}
	switch shape {
	case CutPostgresBlackhole:
		each(rn.pg, (*netfault.Proxy).Blackhole)
	case CutPostgresReset:
		each(rn.pg, (*netfault.Proxy).Reset)
	case CutNATSBlackhole:
		each(rn.nats, (*netfault.Proxy).Blackhole)
	case CutBothBlackhole:
		each(rn.pg, (*netfault.Proxy).Blackhole)
		each(rn.nats, (*netfault.Proxy).Blackhole)
	default:
		return fmt.Errorf("stack: cut %s: unknown shape %q (want one of %s)", instance, shape, strings.Join(CutShapes, ", "))
	}
	for _, f := range do {
		if err := f(); err != nil {
			return fmt.Errorf("stack: cut %s (%s): %w", instance, shape, err)
		}
	}
	return nil
}

// Heal ends any cut of instance's network: new connections carry again;
// the connections a blackhole held are closed (the client reconnects),
// as a peer's timeout would have closed them. Errors as [Stack.Cut].
func (s *Stack) Heal(instance string) error {
	rn, err := s.replicaNet(instance)
	if err != nil {
		return err
	}
	var errs []error
	for _, p := range slices.Concat(rn.pg, rn.nats) {
		errs = append(errs, p.Heal())
	}
	return errors.Join(errs...)
}

func (s *Stack) replicaNet(instance string) (*replicaNet, error) {
	if !s.cfg.Partitions {
		return nil, ErrNoProxies
	}
	rn := s.nets[instance]
	if rn == nil {
		return nil, fmt.Errorf("stack: %q is no service replica of this stack (want one of %s)", instance, strings.Join(s.Partitionable(), ", "))
	}
	return rn, nil
}
