package saga

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tripsaga/tripsaga/saga/internal/dbsqlc"
)

// InstanceEnv names the environment variable that gives a process its
// instance name ("payment-2"); `tripsaga up` sets it for every replica.
// Without it the name is "<host>:<service>".
const InstanceEnv = "TRIPSAGA_INSTANCE"

// Liveness timing: a live process beats every BeatInterval; one whose
// advisory lock is not held and whose last beat is older than DeadAfter is
// dead, and its leases are ended early.
const (
	BeatInterval = time.Second
	DeadAfter    = 3 * time.Second
)

// Liveness is this process's membership among the replicas of its service:
// a row in the schema's processes table and a session-level PostgreSQL
// advisory lock held on a connection of its own for the process's life
// (PostgreSQL docs, "Advisory Locks": a session-level lock is released when
// the session ends, so a process killed with SIGKILL lets go of it at
// once). Step leases carry its id as their owner; a peer ends a lease early
// only when its owner is dead: lock not held and no beat for [DeadAfter],
// or marked gone (stopped, or replaced by a successor of the same instance
// name). It is safe for concurrent use.
type Liveness struct {
	pool     *pgxpool.Pool
	instance string
	log      *slog.Logger
	id       atomic.Int32
	ns       atomic.Int64 // advisory lock namespace: fnv32 of the schema, 31 bits

	mu   sync.Mutex
	conn *pgxpool.Conn // holds the lock; nil while lost
}

// NewLiveness returns the liveness of a process of the service whose
// schema pool reaches (search_path set), named instance ("" = $TRIPSAGA_INSTANCE,
// else "<host>:<service>"). It does nothing until [Liveness.Start].
func NewLiveness(pool *pgxpool.Pool, service, instance string, log *slog.Logger) *Liveness {
	if instance == "" {
		instance = os.Getenv(InstanceEnv)
	}
	if instance == "" {
		host, _ := os.Hostname()
		instance = host + ":" + service
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Liveness{pool: pool, instance: instance, log: log}
}

// ID returns the process's id in the processes table, 0 before Start.
func (l *Liveness) ID() int32 {
	if l == nil {
		return 0
	}
	return l.id.Load()
}

// Instance returns the instance name.
func (l *Liveness) Instance() string { return l.instance }

// Start registers the process, takes its advisory lock and marks earlier
// processes of the same instance name that hold no lock as gone (this one
// replaces them, so their leases end at once). Errors: PostgreSQL
// unreachable, or the lock taken elsewhere (never expected: ids are new).
func (l *Liveness) Start(ctx context.Context) error {
	conn, err := l.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("saga: liveness: %w", err)
	}
	var schema string
	if err := conn.QueryRow(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
		conn.Release()
		return fmt.Errorf("saga: liveness: %w", err)
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(schema))
	l.ns.Store(int64(h.Sum32() & 0x7fffffff))
	host, _ := os.Hostname()
	id, err := queries.ProcessRegister(ctx, conn, dbsqlc.ProcessRegisterParams{Instance: l.instance, Host: host, Pid: int32(os.Getpid())})
	if err != nil {
		conn.Release()
		return fmt.Errorf("saga: liveness: register: %w", err)
	}
	if err := l.lock(ctx, conn, id); err != nil {
		conn.Release()
		return err
	}
	l.id.Store(id)
	l.mu.Lock()
	l.conn = conn
	l.mu.Unlock()
	live, err := l.predecessorsLetGo(ctx, id)
	if err != nil {
		return err
	}
	n, err := queries.ProcessMarkPredecessorsGone(ctx, l.pool, dbsqlc.ProcessMarkPredecessorsGoneParams{Instance: l.instance, ID: id, Live: live})
	if err != nil {
		return fmt.Errorf("saga: liveness: %w", err)
	}
	l.log.Info("saga: liveness: registered", "instance", l.instance, "process_id", id, "predecessors_gone", n)
	return nil
}

// predecessorsLetGo waits (at most 2 s) until no earlier process of this
// instance name holds its lock: a predecessor killed a moment ago may
// still have a PostgreSQL backend finishing its exit. It returns the
// processes whose lock is held then.
func (l *Liveness) predecessorsLetGo(ctx context.Context, id int32) ([]int32, error) {
	prev, err := queries.ProcessPredecessorIDs(ctx, l.pool, dbsqlc.ProcessPredecessorIDsParams{Instance: l.instance, ID: id})
	if err != nil {
		return nil, fmt.Errorf("saga: liveness: %w", err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		live, err := l.Live(ctx)
		if err != nil {
			return nil, err
		}
		held := false
		for _, p := range prev {
			held = held || slices.Contains(live, p)
		}
		if !held || time.Now().After(deadline) {
			return live, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (l *Liveness) lock(ctx context.Context, conn *pgxpool.Conn, id int32) error {
	ok, err := queries.ProcessLock(ctx, conn, dbsqlc.ProcessLockParams{Namespace: int32(l.ns.Load()), ID: id})
	if err != nil {
		return fmt.Errorf("saga: liveness: lock: %w", err)
	}
	if !ok {
		return fmt.Errorf("saga: liveness: the lock of process %d is held by another session", id)
	}
	return nil
}

// Live returns the ids of the service's processes whose advisory lock is
// held now.
func (l *Liveness) Live(ctx context.Context) ([]int32, error) {
	ids, err := queries.ProcessLiveIDs(ctx, l.pool, l.ns.Load())
	if err != nil {
		return nil, fmt.Errorf("saga: liveness: %w", err)
	}
	if ids == nil {
		ids = []int32{}
	}
	return ids, nil
}

// Run beats every [BeatInterval] until ctx ends. A beat that fails (the
// lock's session was lost, say PostgreSQL restarted) is logged at error
// level and the lock is taken again, under the same id, as soon as
// PostgreSQL answers: in between, peers may find this process dead after
// [DeadAfter] and take its leases, and a call this process still has in
// flight may then be made twice (by the same Idempotency-Key).
func (l *Liveness) Run(ctx context.Context) error {
	t := time.NewTicker(BeatInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if err := l.beat(ctx); err != nil && ctx.Err() == nil {
			l.log.Error("saga: liveness: beat failed; taking the lock again", "process_id", l.ID(), "err", err)
		}
		if n, err := queries.ProcessDeleteOld(ctx, l.pool); err == nil && n > 0 {
			l.log.Info("saga: liveness: forgot old processes", "n", n)
		}
	}
}

func (l *Liveness) beat(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	id := l.id.Load()
	if l.conn != nil {
		bctx, cancel := context.WithTimeout(ctx, 2*BeatInterval)
		_, err := queries.ProcessBeat(bctx, l.conn, id)
		cancel()
		if err == nil {
			return nil
		}
		// The session may be gone, and the lock with it.
		l.conn.Conn().Close(context.Background()) //nolint:errcheck // it is broken
		l.conn.Release()
		l.conn = nil
	}
	conn, err := l.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	if err := l.lock(ctx, conn, id); err != nil {
		conn.Release()
		return err
	}
	if _, err := queries.ProcessBeat(ctx, conn, id); err != nil {
		conn.Release()
		return err
	}
	l.conn = conn
	l.log.Warn("saga: liveness: lock taken again", "process_id", id)
	return nil
}

// Close marks the process gone and releases its lock (its session's
// connection is closed, not returned to the pool). Call it after every call
// of the process has finished.
func (l *Liveness) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if id := l.id.Load(); id != 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := queries.ProcessGone(ctx, l.pool, id); err != nil && !errors.Is(err, context.Canceled) {
			l.log.Warn("saga: liveness: could not mark the process gone; peers find it dead after the grace", "err", err)
		}
	}
	if l.conn != nil {
		// Unlock before closing: a closed session's backend exits (and
		// lets go of the lock) a moment later, and peers should not wait.
		// An unlock that answers false means this session did not hold
		// the lock (PostgreSQL docs, "Advisory Lock Functions"): the
		// session was lost, or is shared behind a pooler in transaction
		// mode, so peers may have taken this process for dead: an error.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		unlocked, err := queries.ProcessUnlock(ctx, l.conn, dbsqlc.ProcessUnlockParams{Namespace: int32(l.ns.Load()), ID: l.id.Load()})
		cancel()
		switch {
		case err != nil:
			l.log.Error("saga: liveness: could not unlock; the session's end releases the lock", "process_id", l.id.Load(), "err", err)
		case !unlocked:
			l.log.Error("saga: liveness: unlock answered false: this session did not hold the process's lock (the session was lost, or DATABASE_URL goes through a pooler in transaction mode)", "process_id", l.id.Load())
		}
		l.conn.Conn().Close(context.Background()) //nolint:errcheck // closing
		l.conn.Release()
		l.conn = nil
	}
}

// ReleaseDeadLeases ends now the leases of the service's dead processes
// (never this one's), so a claim takes their rows at once, and returns how
// many rows it freed.
func (l *Liveness) ReleaseDeadLeases(ctx context.Context) (int, error) {
	live, err := l.Live(ctx)
	if err != nil {
		return 0, err
	}
	rows, err := queries.StepReleaseDeadLeases(ctx, l.pool, dbsqlc.StepReleaseDeadLeasesParams{
		Me: l.ID(), Live: live, GraceMs: float64(DeadAfter.Milliseconds()),
	})
	if err != nil {
		return 0, fmt.Errorf("saga: release dead leases: %w", err)
	}
	for _, r := range rows {
		l.log.Warn("saga: took over a lease of a dead process", "trip_id", r.TripID, "step", r.Step, "dead_process_id", r.DeadOwner)
	}
	return len(rows), nil
}
