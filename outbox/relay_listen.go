package outbox

import (
	"context"
	"time"
)

func (r *Relay) listen(ctx context.Context) {
	for ctx.Err() == nil {
		err := r.listenOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		r.cfg.Logger.Warn("outbox relay LISTEN lost; polling meanwhile", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

func (r *Relay) listenOnce(ctx context.Context) error {
	conn, err := r.cfg.Pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "LISTEN "+quoteIdent(r.channel)); err != nil {
		return err
	}
	defer func() {
		// Leave the pooled connection clean.
		_, _ = conn.Exec(context.Background(), "UNLISTEN *")
	}()
	r.Wake() // rows written while we were not listening
	for {
		if _, err := conn.Conn().WaitForNotification(ctx); err != nil {
			return err
		}
		r.Wake()
	}
}

func quoteIdent(s string) string {
	out := []byte{'"'}
	for i := 0; i < len(s); i++ {
		if s[i] == '"' {
			out = append(out, '"')
		}
		out = append(out, s[i])
	}
	return string(append(out, '"'))
}
