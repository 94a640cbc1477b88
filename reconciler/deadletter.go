package reconciler

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/inbox"
	"github.com/tripsaga/tripsaga/process"
)

// MaxDeadLetters is how many dead letters [Operator.DeadLetters] lists at
// most (the newest).
const MaxDeadLetters = 1000

// DeadLetter is a message an inbox parked on the DEADLETTER stream: the
// parked event (its original headers and body, where it came from, which
// consumer parked it and why), when it was parked, what it is about, and
// the operators' re-drives of it.
type DeadLetter struct {
	events.ParkedEvent
	// Time is when it was parked (stored in DEADLETTER), UTC.
	Time time.Time `json:"time"`
	// TripID, Type and EventID are read from its ce-subject, ce-type and
	// ce-id headers ("" when it has none).
	TripID  string `json:"trip_id,omitempty"`
	Type    string `json:"type,omitempty"`
	EventID string `json:"event_id,omitempty"`
	// RedrivenBy lists the ids of the redrive actions asked for it, oldest
	// first.
	RedrivenBy []string `json:"redriven_by"`
}

func deadLetterOf(m *jetstream.RawStreamMsg) DeadLetter {
	h := m.Header
	streamSeq, _ := strconv.ParseUint(h.Get(inbox.HeaderDeadSeq), 10, 64)
	headers := map[string][]string{}
	for k, v := range h {
		headers[k] = v
	}
	return DeadLetter{
		ParkedEvent: events.ParkedEvent{
			Seq: m.Sequence, Stream: h.Get(inbox.HeaderDeadStream), StreamSeq: streamSeq,
			Subject: h.Get(inbox.HeaderDeadSubject), Consumer: h.Get(inbox.HeaderDeadConsumer),
			Reason: h.Get(inbox.HeaderDeadReason), Headers: headers, Data: m.Data,
		},
		Time: m.Time.UTC(), TripID: h.Get("ce-subject"), Type: h.Get("ce-type"), EventID: h.Get("ce-id"),
		RedrivenBy: []string{},
	}
}

// DeadLetter returns the dead letter at seq of the DEADLETTER stream; an
// [ActionError] 404 when there is none.
func (o *Operator) DeadLetter(ctx context.Context, seq uint64) (DeadLetter, error) {
	s, err := o.r.cfg.JetStream.Stream(ctx, events.StreamDeadLetter)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return DeadLetter{}, &ActionError{Status: http.StatusNotFound, Title: "No such dead letter", Detail: fmt.Sprintf("no dead letter %d: nothing was ever parked", seq)}
	}
	if err != nil {
		return DeadLetter{}, fmt.Errorf("dead letters: %w", err)
	}
	m, err := s.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return DeadLetter{}, &ActionError{Status: http.StatusNotFound, Title: "No such dead letter", Detail: fmt.Sprintf("no dead letter %d in the %s stream", seq, events.StreamDeadLetter)}
	}
	if err != nil {
		return DeadLetter{}, fmt.Errorf("dead letter %d: %w", seq, err)
	}
	dls := []DeadLetter{deadLetterOf(m)}
	if err := o.redrives(ctx, dls); err != nil {
		return DeadLetter{}, err
	}
	return dls[0], nil
}

// DeadLetters returns the parked messages of the DEADLETTER stream, oldest
// first (the newest [MaxDeadLetters]), each with its re-drives.
func (o *Operator) DeadLetters(ctx context.Context) ([]DeadLetter, error) {
	out := []DeadLetter{}
	s, err := o.r.cfg.JetStream.Stream(ctx, events.StreamDeadLetter)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return out, nil
	}
	if err != nil {
		return nil, fmt.Errorf("dead letters: %w", err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("dead letters: %w", err)
	}
	if info.State.Msgs == 0 {
		return out, nil
	}
	first := info.State.FirstSeq
	if last := info.State.LastSeq; last-first+1 > MaxDeadLetters {
		first = last - MaxDeadLetters + 1
	}
	for seq := first; seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // deleted
		}
		if err != nil {
			return nil, fmt.Errorf("dead letter %d: %w", seq, err)
		}
		out = append(out, deadLetterOf(m))
	}
	return out, o.redrives(ctx, out)
}

func (o *Operator) redrives(ctx context.Context, dls []DeadLetter) error {
	if len(dls) == 0 {
		return nil
	}
	seqs := make([]int64, 0, len(dls))
	at := map[int64]int{}
	for i, d := range dls {
		seqs = append(seqs, int64(d.Seq))
		at[int64(d.Seq)] = i
	}
	rows, err := queries.OperatorActionRedrives(ctx, o.r.cfg.Pool, seqs)
	if err != nil {
		return fmt.Errorf("dead letters: re-drives: %w", err)
	}
	for _, row := range rows {
		if row.DeadletterSeq.Valid {
			i := at[row.DeadletterSeq.Int64]
			dls[i].RedrivenBy = append(dls[i].RedrivenBy, row.EventID)
		}
	}
	return nil
}

func (o *Operator) serveDeadLetters(w http.ResponseWriter, req *http.Request) {
	dls, err := o.DeadLetters(req.Context())
	if err != nil {
		process.WriteError(w, req, o.log, "reconciler: dead letters", err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"items": dls})
}

func (o *Operator) serveDeadLetter(w http.ResponseWriter, req *http.Request) {
	seq, err := strconv.ParseUint(req.PathValue("seq"), 10, 64)
	if err != nil || seq == 0 {
		process.WriteNotFound(w, req, "Dead letter not found: not a sequence number")
		return
	}
	dl, err := o.DeadLetter(req.Context(), seq)
	var ae *ActionError
	if errors.As(err, &ae) {
		process.WriteNotFound(w, req, ae.Detail)
		return
	}
	if err != nil {
		process.WriteError(w, req, o.log, "reconciler: dead letter", err)
		return
	}
	writeJSON(w, http.StatusOK, dl)
}
