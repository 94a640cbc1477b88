package refund

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/inbox"
	"github.com/tripsaga/tripsaga/outbox"
)

// State is a refund's state in the [View].
type State string

// The refund states the view records. Requested and canceling are on the
// way; canceled, credited and replied are what happened to the refund.
const (
	StateRequested State = "requested" // refund.requested seen, nothing settled
	StateCanceling State = "canceling" // a step failed before the pivot: undoing, newest first
	StateCanceled  State = "canceled"  // every step that happened is undone (or none happened)
	StateCredited  State = "credited"  // the credit is issued (the pivot): only forward now
	StateReplied   State = "replied"   // the customer was sent the reply
)

// rank orders the states so the view only moves forward whatever order
// the streams deliver in (each stream is its own consumer: reply.sent may
// be read before credit.issued). canceling and credited never meet in one
// refund: the pivot either happened or it did not.
func (s State) rank() int {
	switch s {
	case StateRequested:
		return 1
	case StateCanceling, StateCredited:
		return 2
	case StateCanceled, StateReplied:
		return 3
	}
	return 0
}

// stateOf is the state each event the view follows moves a refund to.
var stateOf = map[string]State{ //nolint:gochecknoglobals // read-only declaration
	Requested:              StateRequested,
	HoldRefused:            StateCanceled,
	HoldFailed:             StateCanceled,
	HoldReleased:           StateCanceled,
	HoldReleaseStuck:       StateCanceling,
	InventoryRefused:       StateCanceling,
	InventoryFailed:        StateCanceling,
	InventoryTakenBack:     StateCanceling,
	InventoryTakeBackStuck: StateCanceling,
	CreditRefused:          StateCanceling,
	CreditFailed:           StateCanceling,
	CreditCancelStuck:      StateCanceling,
	CreditIssued:           StateCredited,
	ReplySent:              StateReplied,
}

// viewTypes are the event types the view follows, in the catalogue's order.
func viewTypes() []string {
	var out []string
	for _, t := range []string{
		Requested,
		HoldRefused, HoldFailed, HoldReleased, HoldReleaseStuck,
		InventoryRefused, InventoryFailed, InventoryTakenBack, InventoryTakeBackStuck,
		CreditRefused, CreditFailed, CreditCancelStuck, CreditIssued,
		ReplySent,
	} {
		if _, ok := stateOf[t]; ok {
			out = append(out, t)
		}
	}
	return out
}

// viewSchema is the view's own table, beside the machinery's inbox in
// the refunds desk's schema (the pool's search_path).
const viewSchema = `CREATE TABLE IF NOT EXISTS refund_view (
	refund_id  text PRIMARY KEY,
	state      text NOT NULL,
	last_type  text NOT NULL,
	request    jsonb,
	updated_at timestamptz NOT NULL DEFAULT now()
)`

// View is the refunds desk: it takes a refund ([View.Take]: its row and
// its refund.requested in one transaction, published by its outbox
// relay), and it is the saga's projection: one inbox per stream it reads
// (inbox.New, each event recorded once by its id in the same
// transaction as its effect) into a table refund_view of each refund's
// [State].
type View struct {
	pool    *pgxpool.Pool
	relay   *outbox.Relay
	inboxes []*inbox.Inbox
}

// NewView creates the view's table in pool's schema (which must hold the
// machinery's set: the outbox and the inbox), its relay and its inboxes
// on js.
func NewView(ctx context.Context, pool *pgxpool.Pool, js jetstream.JetStream) (*View, error) {
	if _, err := pool.Exec(ctx, viewSchema); err != nil {
		return nil, fmt.Errorf("refund: view table: %w", err)
	}
	cat := Catalogue()
	relay, err := outbox.NewRelay(outbox.RelayConfig{
		Pool: pool, JetStream: js, Catalogue: cat,
		EnsureStreams: func(ctx context.Context) error {
			return events.EnsureServiceStreams(ctx, js, cat, ServiceRefunds, 1)
		},
	})
	if err != nil {
		return nil, fmt.Errorf("refund: desk relay: %w", err)
	}
	v := &View{pool: pool, relay: relay}
	types := viewTypes()
	var lock sync.Mutex // the view's inboxes apply one batch at a time
	streams := cat.Streams(types)
	names := make([]string, 0, len(streams))
	for s := range streams {
		names = append(names, s)
	}
	slices.Sort(names)
	for _, stream := range names {
		var ts []string
		for _, t := range types {
			if et, _ := cat.Lookup(t); et.Stream == stream {
				ts = append(ts, t)
			}
		}
		in, err := inbox.New(inbox.Config{
			Name: ServiceRefunds, Stream: stream, FilterSubjects: streams[stream], Types: ts,
			Pool: pool, JetStream: js, Handler: v.apply, BatchApply: inbox.HandlerBatch(v.apply), BatchLock: &lock,
			Relay: relay,
		})
		if err != nil {
			return nil, fmt.Errorf("refund: view inbox %s: %w", stream, err)
		}
		v.inboxes = append(v.inboxes, in)
	}
	return v, nil
}

// apply moves the event's refund to the event's state, unless it is
// already at a state of a higher rank; inside the inbox's transaction.
func (v *View) apply(ctx context.Context, tx pgx.Tx, e event.Event) error {
	to, ok := stateOf[e.Type()]
	if !ok {
		return fmt.Errorf("%w: the refund view does not follow %s", inbox.ErrPermanent, e.Type())
	}
	id := e.Subject()
	if err := events.ValidateTripID(id); err != nil {
		return fmt.Errorf("%w: subject: %w", inbox.ErrPermanent, err)
	}
	var cur string
	err := tx.QueryRow(ctx, `SELECT state FROM refund_view WHERE refund_id = $1 FOR UPDATE`, id).Scan(&cur)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		_, err = tx.Exec(ctx, `INSERT INTO refund_view (refund_id, state, last_type) VALUES ($1, $2, $3)
			ON CONFLICT (refund_id) DO NOTHING`, id, string(to), e.Type())
		if err != nil {
			return err
		}
		// A concurrent first event of the same refund won the insert:
		// read it again under its lock.
		if err := tx.QueryRow(ctx, `SELECT state FROM refund_view WHERE refund_id = $1 FOR UPDATE`, id).Scan(&cur); err != nil {
			return err
		}
	case err != nil:
		return err
	}
	if to.rank() <= State(cur).rank() {
		return nil
	}
	_, err = tx.Exec(ctx, `UPDATE refund_view SET state = $2, last_type = $3, updated_at = now() WHERE refund_id = $1`, id, string(to), e.Type())
	return err
}

// ErrTaken is returned by [View.Take] for an order the desk already took
// with another request: the saga's id is the order's, and a refund's
// request never changes.
var ErrTaken = errors.New("refund: order already taken with another request")

// Take takes refund r: in one transaction, its row in refund_view
// (requested) and its refund.requested in the desk's outbox, which the
// relay publishes with Nats-Msg-Id = the event id (the saga's
// transactional outbox rule). Taking the same request again changes
// nothing and returns nil; another request for a taken order returns
// [ErrTaken]; an invalid r, the error of [Refund.Validate].
func (v *View) Take(ctx context.Context, r Refund) error {
	e, err := NewRequested(r)
	if err != nil {
		return err
	}
	tx, err := v.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	req, err := json.Marshal(r)
	if err != nil {
		return err
	}
	tag, err := tx.Exec(ctx, `INSERT INTO refund_view (refund_id, state, last_type, request) VALUES ($1, $2, $3, $4)
		ON CONFLICT (refund_id) DO NOTHING`, r.OrderID, string(StateRequested), Requested, req)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		var same bool
		if err := tx.QueryRow(ctx, `SELECT request = $2::jsonb FROM refund_view WHERE refund_id = $1`, r.OrderID, req).Scan(&same); err != nil {
			return err
		}
		if !same {
			return fmt.Errorf("%w: %s", ErrTaken, r.OrderID)
		}
		return nil
	}
	if err := v.relay.Write(ctx, tx, e); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// Run runs the desk's relay and the view's inboxes until ctx ends.
func (v *View) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return v.relay.Run(ctx) })
	for _, in := range v.inboxes {
		g.Go(func() error { return in.Run(ctx) })
	}
	err := g.Wait()
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// StateOf returns refund id's state in the view, "" when it has none yet.
func (v *View) StateOf(ctx context.Context, id string) (State, error) {
	var s string
	err := v.pool.QueryRow(ctx, `SELECT state FROM refund_view WHERE refund_id = $1`, id).Scan(&s)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	return State(s), err
}
