package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/tripsaga/tripsaga/outbox/internal/dbsqlc"
)

// Waiting is a group of unpublished events whose last publish failed for
// one Cause: they are retried with backoff (outages) or until quarantine
// (refusals).
type Waiting struct {
	Cause Cause `json:"cause"`
	// Events is how many rows wait for this cause.
	Events int64 `json:"events"`
	// Since is the oldest of their last failures (UTC).
	Since time.Time `json:"since"`
	// LastError is the newest failure's error text.
	LastError string `json:"last_error"`
}

// WaitingByCause lists, per Cause, the unpublished events of the schema db
// reaches whose last publish failed. Empty when the outbox flows.
func WaitingByCause(ctx context.Context, db dbsqlc.DBTX) ([]Waiting, error) {
	rows, err := queries.OutboxWaiting(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("outbox: waiting: %w", err)
	}
	out := make([]Waiting, 0, len(rows))
	for _, r := range rows {
		out = append(out, Waiting{Cause: Cause(r.Cause), Events: r.Events, Since: r.OldestFailure.UTC(), LastError: r.LastError})
	}
	return out, nil
}

// LostShownFor is how long [Details] names events the verify found lost.
const LostShownFor = time.Hour

// Details describes the outbox for /readyz: one line per cause of waiting
// events (CauseLost among them), one for the events found lost by their
// stream in the last [LostShownFor], and one for quarantined events; none
// when everything flows.
func Details(ctx context.Context, db dbsqlc.DBTX) ([]string, error) {
	ws, err := WaitingByCause(ctx, db)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, w := range ws {
		kind := "outage"
		switch {
		case w.Cause == CauseLost:
			kind = "lost by their stream, published again once the duplicate window has passed"
		case !w.Cause.Outage():
			kind = "refused, counts towards quarantine"
		}
		out = append(out, fmt.Sprintf("outbox: %d events waiting: %s (%s) since %s: %s",
			w.Events, w.Cause, kind, w.Since.Format(time.RFC3339), w.LastError))
	}
	lost, err := queries.OutboxLostRecently(ctx, db, time.Now().Add(-LostShownFor))
	if err != nil {
		return nil, fmt.Errorf("outbox: lost: %w", err)
	}
	if lost.Lost > 0 {
		out = append(out, fmt.Sprintf("outbox: %d published events were found lost by their stream in the last %s (deleted, purged, restored, or not synced to disk) and put back in line, %d of them not published again yet; newest %s (`tripsaga outbox verify`)",
			lost.Lost, LostShownFor, lost.Waiting, lost.Newest))
	}
	q, err := queries.OutboxCountQuarantined(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("outbox: quarantined: %w", err)
	}
	if q > 0 {
		out = append(out, fmt.Sprintf("outbox: %d events quarantined: list them with `tripsaga outbox list`, re-drive with `tripsaga outbox redrive` once the cause is fixed", q))
	}
	return out, nil
}

// Row is an outbox row shown to a person: quarantined, or waiting after a
// failed publish.
type Row struct {
	ID          int64     `json:"id"`
	EventID     string    `json:"event_id"`
	Subject     string    `json:"subject"`
	CreatedAt   time.Time `json:"created_at"`
	Quarantined bool      `json:"quarantined"`
	// Attempts counts refusals (towards quarantine), Outages the failures
	// for the server's state.
	Attempts     int        `json:"attempts"`
	Outages      int        `json:"outages"`
	Cause        Cause      `json:"cause,omitempty"`
	LastError    string     `json:"last_error,omitempty"`
	LastFailedAt *time.Time `json:"last_failed_at,omitempty"`
	// QuarantinedAt and RedrivenAt are when it was last quarantined and
	// last re-driven.
	QuarantinedAt *time.Time `json:"quarantined_at,omitempty"`
	RedrivenAt    *time.Time `json:"redriven_at,omitempty"`
}

// List returns up to limit quarantined rows of the schema db reaches, and
// with waiting also the unpublished rows whose last publish failed, oldest
// first.
func List(ctx context.Context, db dbsqlc.DBTX, waiting bool, limit int) ([]Row, error) {
	rows, err := queries.OutboxList(ctx, db, dbsqlc.OutboxListParams{IncludeWaiting: waiting, Max: int32(limit)})
	if err != nil {
		return nil, fmt.Errorf("outbox: list: %w", err)
	}
	utc := func(t *time.Time) *time.Time {
		if t == nil {
			return nil
		}
		u := t.UTC()
		return &u
	}
	out := make([]Row, 0, len(rows))
	for _, r := range rows {
		row := Row{
			ID: r.ID, EventID: r.EventID, Subject: r.NatsSubject, CreatedAt: r.CreatedAt.UTC(),
			Quarantined: r.QuarantinedAt != nil, Attempts: int(r.Attempts), Outages: int(r.Outages),
			LastFailedAt: utc(r.LastFailedAt), QuarantinedAt: utc(r.QuarantinedAt), RedrivenAt: utc(r.RedrivenAt),
		}
		if r.LastCause != nil {
			row.Cause = Cause(*r.LastCause)
		}
		if r.LastError != nil {
			row.LastError = *r.LastError
		}
		out = append(out, row)
	}
	return out, nil
}

// Redrive puts quarantined rows of the schema db reaches back in line, all
// of them when eventIDs is empty, and wakes the relays (pg_notify). The
// relay publishes each once more, with its event id as Nats-Msg-Id, so a
// row is stored once however often it is re-driven within the duplicate
// window. It returns the event ids re-driven; ids that are not quarantined
// are left alone.
func Redrive(ctx context.Context, db dbsqlc.DBTX, eventIDs []string) ([]string, error) {
	ids, err := queries.OutboxRedrive(ctx, db, dbsqlc.OutboxRedriveParams{Every: len(eventIDs) == 0, EventIds: eventIDs})
	if err != nil {
		return nil, fmt.Errorf("outbox: redrive: %w", err)
	}
	if len(ids) > 0 {
		if err := queries.OutboxNotify(ctx, db); err != nil {
			return ids, fmt.Errorf("outbox: redrive: notify: %w", err)
		}
	}
	return ids, nil
}
