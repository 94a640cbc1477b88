package outbox

import (
	"context"
	"sync"
)

// afterCommit collects what to do once one transaction has committed.
type afterCommit struct {
	mu    sync.Mutex
	fns   []func()
	relay *Relay
}

type afterCommitKey struct{}

// WithAfterCommit returns a context for work done inside one transaction
// and a function the caller must call once that transaction has committed
// (and only then: after a rollback, or a COMMIT that returned an error,
// it is dropped, and what it would have done is left to the recovery paths,
// which are correct without it).
//
// Inside, [AfterCommit] registers functions to run after the commit, and
// [Write] hands the events it stores to relay (when not nil and running),
// which publishes them at once instead of waiting to claim their rows;
// their rows stay due for every relay's claim after
// RelayConfig.LocalGrace, so an event whose process dies before its PubAck
// is still published.
func WithAfterCommit(ctx context.Context, relay *Relay) (context.Context, func()) {
	ac := &afterCommit{relay: relay}
	return context.WithValue(ctx, afterCommitKey{}, ac), func() {
		ac.mu.Lock()
		fns := ac.fns
		ac.fns = nil
		ac.mu.Unlock()
		for _, f := range fns {
			f()
		}
	}
}

// AfterCommit registers f to run after the transaction of ctx commits (see
// [WithAfterCommit]). It reports false, and registers nothing, when ctx
// was not made by WithAfterCommit.
func AfterCommit(ctx context.Context, f func()) bool {
	ac, ok := ctx.Value(afterCommitKey{}).(*afterCommit)
	if !ok {
		return false
	}
	ac.mu.Lock()
	ac.fns = append(ac.fns, f)
	ac.mu.Unlock()
	return true
}

// localRelay returns the running relay that publishes ctx's events after
// its commit, or nil.
func localRelay(ctx context.Context) *Relay {
	if r := ctxRelay(ctx); r != nil && r.running.Load() {
		return r
	}
	return nil
}

// ctxRelay returns the relay of ctx's [WithAfterCommit], running or not,
// or nil.
func ctxRelay(ctx context.Context) *Relay {
	if ac, ok := ctx.Value(afterCommitKey{}).(*afterCommit); ok {
		return ac.relay
	}
	return nil
}

// InAfterCommit reports whether ctx was made by [WithAfterCommit], so
// that functions registered with [AfterCommit] will run.
func InAfterCommit(ctx context.Context) bool {
	_, ok := ctx.Value(afterCommitKey{}).(*afterCommit)
	return ok
}
