package stack

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"github.com/tripsaga/tripsaga/internal/pgcluster"
	"github.com/tripsaga/tripsaga/internal/redact"
)

// ErrNoPGHA is returned by [Stack.FailOver] on a stack started without
// Config.PGHA.
var ErrNoPGHA = errors.New("stack: not on a PostgreSQL HA pair (Config.PGHA, tripsaga up --pg-ha)")

// haPair is the pg_auto_failover pair of a stack started with
// Config.PGHA.
type haPair struct {
	*pgcluster.HA
	// failing is held by FailOver: one failover at a time.
	failing sync.Mutex
	// inFailover is set while FailOver runs, so the supervisor does not
	// start the killed node's keeper again before the standby is
	// promoted (that would be a restart, not a failover).
	inFailover atomic.Bool
}

// checkPGHA refuses the settings that do not go with Config.PGHA.
func checkPGHA(cfg Config) error {
	switch {
	case !cfg.PGHA:
		return nil
	case cfg.DatabaseURL != "":
		return errors.New("stack: PGHA runs its own pg_auto_failover pair: it takes no DatabaseURL (give one or the other)")
	case cfg.PostgresClockOffset != 0:
		return errors.New("stack: PGHA: PostgresClockOffset is only for the single private cluster")
	}
	return nil
}

// startPGHA starts (or runs again) the pair in Dir/pg-ha and points
// DatabaseURL at it: the superuser's multi-host URL of both nodes with
// target_session_attrs=read-write, from which every role's URL is made
// (pgroles.RoleURL keeps the hosts and the parameters).
func (s *Stack) startPGHA(ctx context.Context) error {
	if os.Geteuid() == 0 {
		// pgcluster.StartHA hands Dir/pg-ha to the postgres OS user,
		// which must be able to reach it.
		if err := allowSearch(s.cfg.Dir); err != nil {
			return err
		}
	}
	ha, err := pgcluster.StartHA(ctx, pgcluster.HAConfig{Dir: filepath.Join(s.cfg.Dir, "pg-ha")})
	if err != nil {
		return fmt.Errorf("stack: PostgreSQL HA pair: %w", err)
	}
	s.ha = &haPair{HA: ha}
	s.DatabaseURL = ha.URL
	s.cfg.Logger.Info("PostgreSQL HA pair up", "url", redact.URL(ha.URL), "monitor", redact.URL(ha.MonitorURL))
	return nil
}

// PGHA returns the pg_auto_failover pair of a stack started with
// Config.PGHA (its monitor's and nodes' URLs and states), or nil.
func (s *Stack) PGHA() *pgcluster.HA {
	if s.ha == nil {
		return nil
	}
	return s.ha.HA
}

// FailOver fails the stack's PostgreSQL pair over (pgcluster.HA.FailOver):
// the primary's node is killed with SIGKILL (keeper and postmaster), the
// monitor promotes the standby, and once a write commits through the
// multi-host URL the old primary is run again and rejoins as the new
// primary's standby; it returns when the pair is whole again, ready for
// the next failover. The services are left alone: their pools and
// liveness sessions find the new primary through their multi-host
// DATABASE_URL. One failover at a time; [ErrNoPGHA] without Config.PGHA.
func (s *Stack) FailOver(ctx context.Context) (pgcluster.Failover, error) {
	if s.ha == nil {
		return pgcluster.Failover{}, ErrNoPGHA
	}
	s.ha.failing.Lock()
	defer s.ha.failing.Unlock()
	s.ha.inFailover.Store(true)
	defer s.ha.inFailover.Store(false)
	f, err := s.ha.FailOver(ctx)
	if err != nil {
		return f, fmt.Errorf("stack: %w", err)
	}
	s.cfg.Logger.Warn("PostgreSQL failed over", "killed", f.Killed, "promoted", f.Promoted,
		"writable_after", f.Writable, "rejoined_after", f.Rejoined)
	return f, nil
}

// superviseHA runs again, as the supervisor does for any child, a keeper
// of the pair (monitor or node) that died outside [Stack.FailOver]; a
// node run again rejoins the pair in whatever role the monitor gives it.
func (s *Stack) superviseHA() {
	if s.ha == nil || s.ha.inFailover.Load() {
		return
	}
	for _, name := range append([]string{"monitor"}, pgcluster.HANodeNames[:]...) {
		if s.ha.Running(name) || s.ha.inFailover.Load() {
			continue
		}
		s.cfg.Logger.Warn("pg_autoctl keeper exited; running it again", "node", name)
		if err := s.ha.Restart(name); err != nil {
			s.cfg.Logger.Error("pg_autoctl keeper restart failed", "node", name, "err", err)
		}
	}
}

// stopPGHA stops the pair's nodes, then its monitor.
func (s *Stack) stopPGHA() {
	if s.ha == nil {
		return
	}
	if err := s.ha.Stop(); err != nil {
		s.cfg.Logger.Error("PostgreSQL HA pair stop", "err", err)
	}
}

// waitReadyOnPair gives an instance not ready in time (err) one more
// chance on a pair: on a loaded machine the monitor may fail a healthy
// primary over while the whole system starts, and the services are not
// ready until a primary takes writes again. It waits until the pair is
// whole, then for the instance once more; without a pair it returns err.
func (s *Stack) waitReadyOnPair(ctx context.Context, name string, err error) error {
	if s.ha == nil {
		return err
	}
	s.cfg.Logger.Warn("not ready in time on the PostgreSQL pair; waiting for the pair, then once more", "process", name)
	if werr := s.ha.WaitPair(ctx); werr != nil {
		return errors.Join(err, werr)
	}
	return s.WaitReady(ctx, name)
}
