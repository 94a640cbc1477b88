package reconciler

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/inbox"
	"github.com/tripsaga/tripsaga/internal/redact"
	"github.com/tripsaga/tripsaga/provider"
	"github.com/tripsaga/tripsaga/saga"
)

// streamEntries reads the events about trip on stream: their subjects are
// "<kind>.<trip>" (events.Subject), so the stream's next-message-by-subject
// look-up finds them without a consumer, for kinds of one to three tokens.
// A stream that does not exist has no entries.
func (r *Reconciler) streamEntries(ctx context.Context, name, trip string) ([]Entry, error) {
	s, err := r.cfg.JetStream.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Entry
	for _, filter := range []string{"*." + trip, "*.*." + trip, "*.*.*." + trip} {
		for seq := uint64(1); len(out) < timelineMaxEvents; {
			m, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(filter))
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				break
			}
			if err != nil {
				return out, err
			}
			out = append(out, eventEntry(r.cfg.Catalogue, name, m))
			seq = m.Sequence + 1
		}
	}
	return out, nil
}

// eventEntry describes one stored event of a stream of catalogue c.
func eventEntry(c events.Catalogue, stream string, m *jetstream.RawStreamMsg) Entry {
	en := Entry{At: m.Time.UTC(), Source: "event", Stream: stream, Seq: m.Sequence, What: m.Subject, Column: strings.ToLower(stream)}
	e, err := events.Decode(m.Header, m.Data)
	if err != nil {
		en.Detail = "cannot be decoded: " + err.Error()
		return en
	}
	en.Type, en.ID = e.Type(), e.ID()
	if k := events.Kind(e.Type()); k != "" {
		en.What = k
	}
	if !e.Time().IsZero() {
		en.At = e.Time().UTC()
	}
	en.Column = eventColumn(c, e.Type(), e.Source(), en.Column)
	// Card tokens and emails are masked in every read view (redact.JSON),
	// and a bidirectional or zero-width character a traveler or an
	// operator sent is shown, not obeyed (events.Visible).
	if json.Valid(e.Data()) {
		en.Data = json.RawMessage(escapeInvisible(redact.JSON(e.Data())))
	}
	en.Detail = events.Visible(redact.Text(summarise(e.Data())))
	return en
}

// escapeInvisible returns the JSON document data with each
// [events.IsInvisible] character written as its JSON escape ("\u202e"):
// the same value, but one that reorders or hides nothing where the
// document is shown as text. Such characters can only be inside strings
// of valid JSON, where the escape means the same.
func escapeInvisible(data []byte) []byte {
	if !bytes.ContainsFunc(data, events.IsInvisible) {
		return data
	}
	out := make([]byte, 0, len(data)+16)
	for _, r := range string(data) {
		if events.IsInvisible(r) {
			if r > 0xFFFF { // a surrogate pair (RFC 8259, section 7)
				r1, r2 := utf16.EncodeRune(r)
				out = fmt.Appendf(out, "\\u%04x\\u%04x", r1, r2)
				continue
			}
			out = fmt.Appendf(out, "\\u%04x", r)
			continue
		}
		out = utf8.AppendRune(out, r)
	}
	return out
}

// eventColumn is "operator" for an operator's action, else the service
// that publishes typ: its declaration in catalogue c, else the last part
// of its CloudEvents source ("/tripsaga/operator"), else fallback.
func eventColumn(c events.Catalogue, typ, source, fallback string) string {
	if typ == events.OperatorAction {
		return "operator" // published by the reconciler's API for a person
	}
	if et, ok := c.Lookup(typ); ok {
		return et.Service
	}
	if i := strings.LastIndex(source, "/"); i >= 0 && i < len(source)-1 {
		return source[i+1:]
	}
	return fallback
}

// maskRecord returns a company's record with its card tokens and emails
// masked (redact.JSON), for the read views.
func maskRecord(rec provider.Record) provider.Record {
	b, err := json.Marshal(rec)
	if err != nil {
		return rec
	}
	var out provider.Record
	if json.Unmarshal(redact.JSON(b), &out) != nil {
		return rec
	}
	return out
}

// summarise picks the words an operator reads first out of an event's
// data: the reason, the company record, the status; and for an event no
// step publishes (an operator's action, say) who did what and why.
func summarise(data []byte) string {
	var m map[string]any
	if json.Unmarshal(data, &m) != nil {
		return ""
	}
	var parts []string
	for _, k := range []string{"status", "action", "operator", "company_ref", "reason", "service", "incident", "deadletter_seq", "error"} {
		v, ok := m[k]
		if !ok || v == nil || v == "" {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s %v", strings.ReplaceAll(k, "_", " "), v))
	}
	return strings.Join(parts, "; ")
}

// deadLetterEntries scans DEADLETTER for copies of events about trip
// (their original subject "<kind>.<trip>" or their ce-subject).
func (r *Reconciler) deadLetterEntries(ctx context.Context, trip string) ([]Entry, error) {
	s, err := r.cfg.JetStream.Stream(ctx, events.StreamDeadLetter)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Entry
	for seq, n := uint64(1), 0; n < deadLetterScanMax; n++ {
		m, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(events.DeadLetterSubjectPrefix+".>"))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return out, err
		}
		seq = m.Sequence + 1
		orig := m.Header.Get(inbox.HeaderDeadSubject)
		if !strings.HasSuffix(orig, "."+trip) && m.Header.Get("ce-subject") != trip {
			continue
		}
		en := Entry{At: m.Time.UTC(), Column: "deadletter", Source: "deadletter", Stream: events.StreamDeadLetter, Seq: m.Sequence,
			What:    "parked by " + m.Header.Get(inbox.HeaderDeadConsumer),
			Detail:  fmt.Sprintf("%s #%s (%s): %s", m.Header.Get(inbox.HeaderDeadStream), m.Header.Get(inbox.HeaderDeadSeq), orig, m.Header.Get(inbox.HeaderDeadReason)),
			Headers: map[string]string{}}
		for k := range m.Header {
			en.Headers[k] = m.Header.Get(k)
		}
		if e, err := events.Decode(m.Header, m.Data); err == nil {
			en.Type, en.ID = e.Type(), e.ID()
		}
		if json.Valid(m.Data) {
			en.Data = json.RawMessage(redact.JSON(m.Data))
		}
		out = append(out, en)
	}
	return out, nil
}

// stepEntries turns a service's step rows and incidents into entries.
func stepEntries(service string, steps []saga.StepView, incs []saga.Incident) []Entry {
	var out []Entry
	for _, s := range steps {
		out = append(out, Entry{At: s.CreatedAt.UTC(), Column: service, Source: "step", What: s.Step + " started",
			Detail: "key " + s.IdempotencyKey})
		if s.FinishedAt != nil {
			// Outcome is the company's last answer, an undo's once
			// there was one: the detail says so.
			d := fmt.Sprintf("%d attempt(s)", s.Attempts)
			if s.Outcome != "" {
				d += "; last answer " + s.Outcome
			}
			if s.CompanyRef != "" {
				d += "; company record " + s.CompanyRef
			}
			if s.Reason != "" {
				d += "; reason " + s.Reason
			}
			out = append(out, Entry{At: s.FinishedAt.UTC(), Column: service, Source: "step", What: s.Step + " finished", Detail: d})
		}
		if s.UndoneAt != nil {
			out = append(out, Entry{At: s.UndoneAt.UTC(), Column: service, Source: "step", What: s.Step + " undone",
				Detail: fmt.Sprintf("cause %s; %d undo attempt(s)", cmp.Or(s.UndoCause, "?"), s.UndoAttempts)})
		} else if s.UndoAttempts > 0 {
			out = append(out, Entry{At: time.Now().UTC(), Column: service, Source: "step", What: s.Step + " undo not done yet",
				Detail: fmt.Sprintf("status %s; %d undo attempt(s); last error: %s", s.Status, s.UndoAttempts, s.LastError)})
		}
	}
	for _, in := range incs {
		out = append(out, Entry{At: in.RaisedAt.UTC(), Column: service, Source: "incident", What: "incident " + in.Kind + " raised",
			Detail: fmt.Sprintf("step %s; %d attempt(s); last error: %s", in.Step, in.Attempts, in.LastError)})
		if in.ResolvedAt != nil {
			out = append(out, Entry{At: in.ResolvedAt.UTC(), Column: service, Source: "incident", What: "incident " + in.Kind + " resolved",
				Detail: "step " + in.Step})
		}
	}
	return out
}

// companyRecords reads each company's record of the trip, by the
// Idempotency-Key of the step's log row or, without one (the step log not
// read, or no row: an orphan), by the key the step would have used,
// "<trip>:<KeyNames[step] or step>"; each says which it was asked by and
// what came back: the record, none (404), or why it was not read.
func (r *Reconciler) companyRecords(ctx context.Context, trip string, steps []saga.StepView) []CompanyRecord {
	cos := r.companies()
	out := make([]CompanyRecord, len(cos))
	var wg sync.WaitGroup
	for i, co := range cos {
		key, from := "", KeyFromStepLog
		for _, s := range steps {
			if s.Step == co.step && s.IdempotencyKey != "" {
				key = s.IdempotencyKey
			}
		}
		if key == "" {
			key, from = trip+":"+cmp.Or(r.cfg.KeyNames[co.step], co.step), KeyFromConvention
		}
		out[i] = CompanyRecord{Company: co.c.Company, Step: co.step, Key: key, KeyFrom: from, Resource: co.c.Resource}
		wg.Go(func() {
			var rec provider.Record
			err := getJSON(ctx, co.c.BaseURL+"/"+co.c.Resource+"/"+url.PathEscape(key), &rec)
			var nf *notFoundError
			switch {
			case errors.As(err, &nf):
				out[i].None = true
			case err != nil:
				out[i].Error = err.Error()
			default:
				out[i].Record = maskRecord(rec)
			}
		})
	}
	wg.Wait()
	return out
}
