package saga

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tripsaga/tripsaga/saga/internal/dbsqlc"
)

// InstanceEnv names the environment variable that gives a process its
// instance name ("charge-2"); `tripsaga up` sets it for every replica.
// Without it the name is "<host>:<service>".
const InstanceEnv = "TRIPSAGA_INSTANCE"

// Liveness timing. A live process beats every BeatInterval on its lock's
// session. The last beat that committed is this process's proof of life:
// one that has confirmed none for FenceAfter (counted on its own monotonic
// clock from the moment it sent that beat) is fenced: it starts no company
// call until a beat commits again (see [Liveness.Fenced]). A peer takes
// the leases of a process only when that process is dead: its advisory
// lock is not held and its last beat is older, on the database's clock,
// than FenceAfter + the longest call timeout of the service + TakeoverMargin
// ([Liveness.TakeoverAfter]), or it is marked gone.
//
// Why no two calls of one key are in flight at once, even when a replica
// is cut from PostgreSQL (not killed) with a call in flight: the beat that
// wrote seen_at = S (the database's now() when the statement ran) was sent
// at a time no later than S, so the replica's fence falls at or before
// S + FenceAfter. A call it starts is started before the fence and has
// its deadline CallTimeout after its start, so every call of it is over
// by S + FenceAfter + CallTimeout. A peer takes its rows only once the
// database's now() is past S + FenceAfter + the longest CallTimeout +
// TakeoverMargin; the margin covers the company noticing the caller's
// closed connection and the two clocks' rates over seconds. The lock
// condition keeps a replica that is slow but still holds its session
// from being taken for dead; it no longer decides safety.
//
// Why a silent replica's lock is freed in time, whatever the network
// does: its lock's session runs with idle_session_timeout = LockIdleTimeout
// (PostgreSQL docs, "Client Connection Defaults": the server ends a session
// idle that long outside a transaction, which releases its session-level
// advisory locks). A live session is never idle longer than BeatInterval,
// so the server frees a blackholed replica's lock at most LockIdleTimeout
// after its last beat, before the takeover grace has passed (LockIdleTimeout
// < FenceAfter + TakeoverMargin), without waiting for TCP to notice a peer
// that sends no reset (two hours by the OS's default keepalive).
const (
	BeatInterval    = time.Second
	FenceAfter      = 3 * time.Second
	TakeoverMargin  = time.Second
	LockIdleTimeout = FenceAfter + BeatInterval/2
	// ReconnectTimeout bounds opening a new lock session and taking the
	// lock again after a beat failed.
	ReconnectTimeout = 5 * time.Second
)

// Liveness is this process's membership among the replicas of its service:
// a row in the schema's processes table and a session-level PostgreSQL
// advisory lock held on a connection of its own (not the pool's) for the
// process's life (PostgreSQL docs, "Advisory Locks": a session-level lock
// is released when the session ends, so a process killed with SIGKILL
// lets go of it at once). Step leases carry its id as their owner; a peer
// ends a lease early only when its owner is dead (see [FenceAfter]): lock
// not held and no beat for [Liveness.TakeoverAfter], or marked gone
// (stopped, or replaced by a successor of the same instance name). It is
// safe for concurrent use.
type Liveness struct {
	pool     *pgxpool.Pool
	instance string
	log      *slog.Logger
	id       atomic.Int32
	ns       atomic.Int64 // advisory lock namespace: fnv32 of the schema, 31 bits

	// epoch anchors lastOK on the monotonic clock.
	epoch time.Time
	// lastOK is when (ns since epoch) the last beat that committed was
	// sent; 0 before Start.
	lastOK atomic.Int64
	// longestCall is the longest CallTimeout of the runners that use this
	// liveness (ns), set by [New].
	longestCall atomic.Int64
	// fenced remembers the last state logged.
	fenced atomic.Bool

	mu   sync.Mutex
	conn *pgx.Conn // holds the lock; nil while lost
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
	return &Liveness{pool: pool, instance: instance, log: log, epoch: time.Now()}
}

// noteCallTimeout records a runner's call timeout: the takeover grace
// counts the longest.
func (l *Liveness) noteCallTimeout(d time.Duration) {
	for {
		cur := l.longestCall.Load()
		if int64(d) <= cur || l.longestCall.CompareAndSwap(cur, int64(d)) {
			return
		}
	}
}

// TakeoverAfter is how long a process's last beat must be past (on the
// database's clock), its lock not held, before a peer takes its leases:
// [FenceAfter] + the longest call timeout of the runners using l +
// [TakeoverMargin] (6 s with the default CALL_TIMEOUT_MS=2000). Every
// replica of a service must run with the same CALL_TIMEOUT_MS: a peer
// counts its own.
func (l *Liveness) TakeoverAfter() time.Duration {
	return FenceAfter + time.Duration(l.longestCall.Load()) + TakeoverMargin
}

// confirm records a beat sent at sent that committed.
func (l *Liveness) confirm(sent time.Time) {
	ns := int64(sent.Sub(l.epoch))
	for {
		cur := l.lastOK.Load()
		if ns <= cur || l.lastOK.CompareAndSwap(cur, ns) {
			return
		}
	}
}

// FenceAt returns when this process becomes fenced unless a beat commits
// first: [FenceAfter] after the last committed beat was sent (on the
// monotonic clock), and ok false for a nil liveness or before Start (no
// fence: leases then end only when their time runs out).
func (l *Liveness) FenceAt() (at time.Time, ok bool) {
	if l == nil || l.id.Load() == 0 {
		return time.Time{}, false
	}
	return l.epoch.Add(time.Duration(l.lastOK.Load()) + FenceAfter), true
}

// Fenced reports whether this process may not start a company call now:
// no beat has committed for [FenceAfter], so peers may soon take its
// leases. False for a nil liveness or before Start.
func (l *Liveness) Fenced() bool {
	at, ok := l.FenceAt()
	return ok && !time.Now().Before(at)
}

// connect opens the lock's own session with the pool's connection settings
// (search_path included), and idle_session_timeout = [LockIdleTimeout] so
// the server ends the session, and frees the lock, once this process is
// silent, whatever the network between them does.
func (l *Liveness) connect(ctx context.Context) (*pgx.Conn, error) {
	pcfg := l.pool.Config()
	conn, err := pgx.ConnectConfig(ctx, pcfg.ConnConfig.Copy())
	if err != nil {
		return nil, fmt.Errorf("saga: liveness: connect: %w", err)
	}
	// The pool's own settings (search_path, the network timeouts) are set
	// after connecting (process), not as startup parameters.
	if pcfg.AfterConnect != nil {
		if err := pcfg.AfterConnect(ctx, conn); err != nil {
			drop(conn)
			return nil, fmt.Errorf("saga: liveness: connect: %w", err)
		}
	}
	if _, err := conn.Exec(ctx, "SET idle_session_timeout = "+strconv.FormatInt(LockIdleTimeout.Milliseconds(), 10)); err != nil {
		drop(conn)
		return nil, fmt.Errorf("saga: liveness: connect: %w", err)
	}
	return conn, nil
}

// drop closes a lock session that failed or is done with (best effort,
// briefly: it may be blackholed).
func drop(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_ = conn.Close(ctx)
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
	conn, err := l.connect(ctx)
	if err != nil {
		return err
	}
	var schema string
	if err := conn.QueryRow(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
		drop(conn)
		return fmt.Errorf("saga: liveness: %w", err)
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(schema))
	l.ns.Store(int64(h.Sum32() & 0x7fffffff))
	host, _ := os.Hostname()
	sent := time.Now() // the row's seen_at is now() of the insert
	id, err := queries.ProcessRegister(ctx, conn, dbsqlc.ProcessRegisterParams{Instance: l.instance, Host: host, Pid: int32(os.Getpid())})
	if err != nil {
		drop(conn)
		return fmt.Errorf("saga: liveness: register: %w", err)
	}
	if err := l.lock(ctx, conn, id); err != nil {
		drop(conn)
		return err
	}
	l.confirm(sent)
	l.id.Store(id)
	// The start's other statements run on the lock's session too (Run
	// has not begun), so it is never idle for long while the pool,
	// maybe over a slow network, opens its first connections.
	live, err := l.predecessorsLetGo(ctx, conn, id)
	if err != nil {
		drop(conn)
		return err
	}
	n, err := queries.ProcessMarkPredecessorsGone(ctx, conn, dbsqlc.ProcessMarkPredecessorsGoneParams{Instance: l.instance, ID: id, Live: live})
	if err != nil {
		drop(conn)
		return fmt.Errorf("saga: liveness: %w", err)
	}
	l.mu.Lock()
	l.conn = conn
	l.mu.Unlock()
	l.log.Info("saga: liveness: registered", "instance", l.instance, "process_id", id, "predecessors_gone", n)
	return nil
}

// predecessorsLetGo waits (at most 2 s) until no earlier process of this
// instance name holds its lock: a predecessor killed a moment ago may
// still have a PostgreSQL backend finishing its exit. It returns the
// processes whose lock is held then.
func (l *Liveness) predecessorsLetGo(ctx context.Context, conn *pgx.Conn, id int32) ([]int32, error) {
	prev, err := queries.ProcessPredecessorIDs(ctx, conn, dbsqlc.ProcessPredecessorIDsParams{Instance: l.instance, ID: id})
	if err != nil {
		return nil, fmt.Errorf("saga: liveness: %w", err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		live, err := l.live(ctx, conn)
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

func (l *Liveness) lock(ctx context.Context, conn *pgx.Conn, id int32) error {
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
	return l.live(ctx, l.pool)
}

func (l *Liveness) live(ctx context.Context, db dbsqlc.DBTX) ([]int32, error) {
	ids, err := queries.ProcessLiveIDs(ctx, db, l.ns.Load())
	if err != nil {
		return nil, fmt.Errorf("saga: liveness: %w", err)
	}
	if ids == nil {
		ids = []int32{}
	}
	return ids, nil
}

// Run beats every [BeatInterval] until ctx ends. A beat that fails (the
// lock's session was lost: PostgreSQL restarted, the network cut or
// blackholed) is logged at error level, the session is dropped, and the
// lock is taken again on a new session, under the same id, as soon as
// PostgreSQL answers; a beat is bounded by 2 × [BeatInterval] and a new
// session by [ReconnectTimeout], so a blackhole never holds the beat up. Once no beat has committed for
// [FenceAfter] the process is fenced (logged once): it starts no company
// call, and its peers take its leases after [Liveness.TakeoverAfter]; a
// call it still has in flight ends by then (its deadline), so no call is
// ever made twice at once.
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
		switch fenced := l.Fenced(); {
		case fenced && !l.fenced.Swap(true):
			l.log.Error("saga: liveness: no beat confirmed by PostgreSQL for the fence bound: starting no company call until one is; peers may take this process's leases",
				"process_id", l.ID(), "fence_after", FenceAfter, "takeover_after", l.TakeoverAfter())
		case !fenced && l.fenced.Swap(false):
			l.log.Warn("saga: liveness: beat confirmed again; calling companies again", "process_id", l.ID())
		}
		dctx, cancel := context.WithTimeout(ctx, 2*BeatInterval)
		if n, err := queries.ProcessDeleteOld(dctx, l.pool); err == nil && n > 0 {
			l.log.Info("saga: liveness: forgot old processes", "n", n)
		}
		cancel()
	}
}

func (l *Liveness) beat(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	id := l.id.Load()
	relocked := false
	if l.conn == nil {
		// A new session takes a few round trips (TCP, TLS, SCRAM): it
		// gets longer than a beat, and the process is fenced meanwhile.
		cctx, cancel := context.WithTimeout(ctx, ReconnectTimeout)
		defer cancel()
		conn, err := l.connect(cctx)
		if err != nil {
			return err
		}
		if err := l.lock(cctx, conn, id); err != nil {
			drop(conn)
			return err
		}
		l.conn, relocked = conn, true
	}
	bctx, cancel := context.WithTimeout(ctx, 2*BeatInterval)
	defer cancel()
	sent := time.Now()
	n, err := queries.ProcessBeat(bctx, l.conn, id)
	if err == nil && n == 0 {
		err = fmt.Errorf("saga: liveness: process %d has no row", id)
	}
	if err != nil {
		// The session may be gone, and the lock with it.
		drop(l.conn)
		l.conn = nil
		return err
	}
	l.confirm(sent)
	if relocked {
		l.log.Warn("saga: liveness: lock taken again", "process_id", id)
	}
	return nil
}

// Close marks the process gone and releases its lock (its session is
// closed). Call it after every call of the process has finished. An
// unlock that answers false (the session had lost the lock) or fails is
// logged at error level: peers then find the process by its gone mark, or
// dead after [Liveness.TakeoverAfter].
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
		ok, err := queries.ProcessUnlock(ctx, l.conn, dbsqlc.ProcessUnlockParams{Namespace: int32(l.ns.Load()), ID: l.id.Load()})
		cancel()
		switch {
		case err != nil:
			l.log.Error("saga: liveness: could not release the lock; it goes with the session", "process_id", l.ID(), "err", err)
		case !ok:
			l.log.Error("saga: liveness: unlock answered false: this session did not hold the process's lock (the session was lost, or DATABASE_URL goes through a pooler in transaction mode)", "process_id", l.ID())
		}
		drop(l.conn)
		l.conn = nil
	}
}

// ReleaseDeadLeases ends now the leases of the service's dead processes
// (never this one's): lock not held and silent for [Liveness.TakeoverAfter],
// or gone. A claim then takes their rows at once. It returns how many rows
// it freed.
func (l *Liveness) ReleaseDeadLeases(ctx context.Context) (int, error) {
	// Bounded, so a blackholed pool does not hold the runner's loop.
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	live, err := l.Live(ctx)
	if err != nil {
		return 0, err
	}
	rows, err := queries.StepReleaseDeadLeases(ctx, l.pool, dbsqlc.StepReleaseDeadLeasesParams{
		Me: l.ID(), Live: live, GraceMs: float64(l.TakeoverAfter().Milliseconds()),
	})
	if err != nil {
		return 0, fmt.Errorf("saga: release dead leases: %w", err)
	}
	for _, r := range rows {
		l.log.Warn("saga: took over a lease of a dead process", "trip_id", r.TripID, "step", r.Step, "dead_process_id", r.DeadOwner)
	}
	return len(rows), nil
}
