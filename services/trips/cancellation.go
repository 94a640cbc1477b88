package trips

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"golang.org/x/text/currency"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/outbox"
	"github.com/tripsaga/tripsaga/process"
	"github.com/tripsaga/tripsaga/services/trips/internal/dbsqlc"
)

// The traveler's cancellation statuses (trips-api.md, Statuses): a
// confirmed trip the traveler cancels is canceling_by_traveler while the
// hold is released, the car canceled and the charge refunded but the fee,
// then canceled_by_traveler (final).
const (
	StatusCancelingByTraveler = "canceling_by_traveler"
	StatusCanceledByTraveler  = "canceled_by_traveler"
)

// travelerKinds returns the event kinds of the parts of a traveler's
// cancellation, by service (the hotel's, the card processor's, the car
// firm's, and the insurer's with the insurance step on), each done once its
// kind is seen: the triggers of the catalogue's traveler_settle step.
func travelerKinds(version string) map[string]string {
	out := map[string]string{}
	c := catalogueOf(version) // the trip's steps, not this process's STEPS
	settle, _ := c.Step("traveler_settle")
	for _, typ := range settle.Trigger {
		if et, ok := c.Lookup(typ); ok {
			out[et.Service] = events.Kind(typ)
		}
	}
	return out
}

// Cancellation is the traveler's cancellation of a trip, as GET
// /trips/{id} shows it. Amounts are minor units of Currency:
// FeeCents + RefundCents == ChargedCents.
type Cancellation struct {
	RequestedAt  time.Time `json:"requested_at"`
	Band         string    `json:"band"`
	ChargedCents int64     `json:"charged_cents"`
	FeeCents     int64     `json:"fee_cents"`
	RefundCents  int64     `json:"refund_cents"`
	Currency     string    `json:"currency"`
	// Steps: "hotel" released, "car" canceled, "payment" refunded (and
	// "insurance" canceled with the insurance step on), or "pending"
	// while the company has not answered yet.
	Steps      map[string]string `json:"steps"`
	CanceledAt *time.Time        `json:"canceled_at,omitempty"`
}

func cancellationFromRow(row dbsqlc.Trip, req events.TripRequest) *Cancellation {
	if row.CancelRequestedAt == nil {
		return nil
	}
	c := &Cancellation{
		RequestedAt: row.CancelRequestedAt.UTC(), ChargedCents: row.ChargedCents.Int64,
		FeeCents: row.FeeCents.Int64, RefundCents: row.RefundCents.Int64, Currency: req.Payment.Currency,
		Steps: map[string]string{},
	}
	if row.CancelBand != nil {
		c.Band = *row.CancelBand
	}
	done := map[string]string{"hotel": "released", "payment": "refunded", "car": "canceled", "insurance": "canceled"}
	for part, kind := range travelerKinds(row.Version) {
		c.Steps[part] = "pending"
		if slices.Contains(row.Seen, kind) {
			c.Steps[part] = done[part]
		}
	}
	if row.CanceledAt != nil {
		t := row.CanceledAt.UTC()
		c.CanceledAt = &t
	}
	return c
}

// handleCancellation mounts POST /trips/{id}/cancellation.
func (s *Service) handleCancellation(mux *http.ServeMux) {
	mux.HandleFunc("POST /trips/{id}/cancellation", s.postCancellation)
}

// problemNotCancelable is the problem type of a cancellation refused for
// the trip's status.
const problemNotCancelable = "https://tripsaga.io/problems/trip-not-cancelable"

// statusProblem is a 409 naming the trip's status (extension member
// trip_status).
type statusProblem struct {
	process.Problem
	TripStatus string `json:"trip_status"`
}

// emptyBody reports whether raw is a cancellation's body: nothing (white
// space only), or one JSON object with no members, spaced any way ("{ }",
// "{}\n"): what a client's JSON encoder sends for an empty object.
func emptyBody(raw []byte) bool {
	b := bytes.TrimSpace(raw)
	if len(b) == 0 {
		return true
	}
	if b[0] != '{' || b[len(b)-1] != '}' {
		return false
	}
	return len(bytes.TrimSpace(b[1:len(b)-1])) == 0
}

func (s *Service) postCancellation(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if !IsTripID(id) {
		process.WriteNotFound(w, r, "Trip not found")
		return
	}
	var errs []FieldError
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1024))
	if err != nil || !emptyBody(raw) {
		errs = append(errs, FieldError{Field: "body", Pointer: "", Detail: "must be empty or {}: a cancellation takes no fields"})
	}
	key, detail := KeyOf(r.Header)
	if detail != "" {
		errs = append(errs, FieldError{Field: "Idempotency-Key", Pointer: "header:Idempotency-Key", Detail: detail})
	} else if key == "" {
		errs = append(errs, FieldError{Field: "Idempotency-Key", Pointer: "header:Idempotency-Key", Detail: "required: the same key asks for the same cancellation again"})
	} else if detail := CheckKey(key); detail != "" {
		errs = append(errs, FieldError{Field: "Idempotency-Key", Pointer: "header:Idempotency-Key", Detail: detail})
	}
	if len(errs) > 0 {
		writeProblem(w, Problem{Type: problemInvalidRequest, Title: "Invalid cancellation request", Status: http.StatusBadRequest,
			Detail: fmt.Sprintf("%d field(s) are invalid", len(errs)), Errors: errs})
		return
	}
	wait, applied := ParseWait(r.Header)
	// PostgreSQL keeps microseconds: the event's requested_at and the
	// API's (read back) are then the same instant, to the digit.
	row, err := s.cancel(r.Context(), id, key, time.Now().Truncate(time.Microsecond))
	var refused *notCancelable
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		process.WriteNotFound(w, r, "Trip not found")
		return
	case errors.As(err, &refused):
		detail := "only a confirmed trip can be canceled by the traveler; this one is " + refused.status
		if refused.otherKey {
			detail = "the trip is " + refused.status + " by another cancellation request (another Idempotency-Key)"
		}
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusConflict)
		_ = json.NewEncoder(w).Encode(statusProblem{
			Problem:    Problem{Type: problemNotCancelable, Title: "The trip cannot be canceled in its status", Status: http.StatusConflict, Detail: detail, Instance: r.URL.EscapedPath()},
			TripStatus: refused.status,
		})
		return
	case err != nil:
		process.WriteError(w, r, s.log, "cancel trip", err)
		return
	}
	row = s.waitUntil(r.Context(), row, wait, func(st string) bool { return st != StatusCancelingByTraveler })
	if applied {
		w.Header().Set("Preference-Applied", "wait="+strconv.Itoa(int(wait/time.Second)))
	}
	w.Header().Set("Location", "/trips/"+row.TripID)
	code := http.StatusAccepted
	if row.Status == StatusCanceledByTraveler {
		code = http.StatusOK
	}
	writeJSON(w, code, tripFromRow(row))
}

// notCancelable: the trip's status does not allow a cancellation by this
// request.
type notCancelable struct {
	status   string
	otherKey bool
}

func (e *notCancelable) Error() string { return "trips: trip is " + e.status }

// cancel records the traveler's cancellation of a confirmed trip and its
// trip.cancellation_requested event in one transaction, with the fee the
// policy keeps at now. The same key again returns the trip as it is; a
// trip that is not confirmed (pending, canceling, canceled, or canceled by
// another key) is a *notCancelable; an unknown trip pgx.ErrNoRows.
func (s *Service) cancel(ctx context.Context, id, key string, now time.Time) (dbsqlc.Trip, error) {
	var row dbsqlc.Trip
	err := s.uow.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		// Lock the row: a booking still running (pending, canceling) moves it
		// under this lock too, so the status read here is the one that holds.
		cur, err := queries.TripGetForUpdate(ctx, tx, id)
		if err != nil {
			return err
		}
		switch {
		case cur.Status == StatusConfirmed:
		case cur.CancelKey != nil && *cur.CancelKey == key:
			row = cur
			return nil // the same request again
		default:
			row = cur
			return &notCancelable{status: cur.Status, otherKey: cur.CancelKey != nil}
		}
		var req events.TripRequest
		if err := json.Unmarshal(cur.Request, &req); err != nil {
			return fmt.Errorf("trip %s: stored request: %w", id, err)
		}
		checkIn, err := time.Parse(time.DateOnly, req.Hotel.CheckIn)
		if err != nil {
			return fmt.Errorf("trip %s: stored check-in: %w", id, err)
		}
		fee := s.policy.Fee(req.Payment.AmountCents, req.Hotel.Nights, checkIn, now)
		row, err = queries.TripRequestCancellation(ctx, tx, dbsqlc.TripRequestCancellationParams{
			TripID: id, CancelKey: &key, RequestedAt: &now, Band: &fee.Band,
			ChargedCents: pgtype.Int8{Int64: req.Payment.AmountCents, Valid: true},
			FeeCents:     pgtype.Int8{Int64: fee.FeeCents, Valid: true},
			RefundCents:  pgtype.Int8{Int64: fee.RefundCents, Valid: true},
		})
		if err != nil {
			return err
		}
		return publish(ctx, tx, events.TripCancellationRequested, id, cur.Version, events.CancellationData{
			TripID: id, Request: req, ChargedCents: req.Payment.AmountCents, FeeCents: fee.FeeCents,
			RefundCents: fee.RefundCents, Currency: req.Payment.Currency, Band: fee.Band, RequestedAt: now.UTC(),
		})
	})
	var nc *notCancelable
	if err != nil && !errors.As(err, &nc) {
		return dbsqlc.Trip{}, err
	}
	return row, err
}

// projectCancellation settles a trip the traveler is canceling once the
// hold is released, the car canceled and the charge refunded (each kind in
// row.Seen, in any order): canceled_by_traveler, trip.canceled_by_traveler
// and its email (with the fee), in the inbox transaction tx.
func (s *Service) projectCancellation(ctx context.Context, tx pgx.Tx, row dbsqlc.Trip) error {
	if row.Status != StatusCancelingByTraveler {
		return nil
	}
	for _, kind := range travelerKinds(row.Version) {
		if !slices.Contains(row.Seen, kind) {
			return nil
		}
	}
	var req events.TripRequest
	_ = json.Unmarshal(row.Request, &req)
	fee, refund := row.FeeCents.Int64, row.RefundCents.Int64
	ev, err := events.New(events.Source("trips"), events.TripCanceledByTraveler, row.TripID, events.TripSettledData{
		TripID: row.TripID, Status: StatusCanceledByTraveler, Traveler: req.Traveler,
		FeeCents: &fee, RefundCents: &refund, Currency: req.Payment.Currency,
	})
	if err != nil {
		return err
	}
	events.SetVersion(&ev, row.Version)
	if err := s.requestMail(ctx, tx, ev); err != nil {
		return err
	}
	stamps, err := queries.TripSetCanceledByTraveler(ctx, tx, row.TripID)
	if err != nil {
		return err
	}
	if err := queries.TripNotifySettled(ctx, outbox.Later(tx), dbsqlc.TripNotifySettledParams{TripID: row.TripID, Sender: s.sender}); err != nil {
		return err
	}
	row.Status = StatusCanceledByTraveler
	for _, st := range stamps { // the database's stamps, as committed
		row.CanceledAt, row.UpdatedAt = st.CanceledAt, st.UpdatedAt
	}
	outbox.AfterCommit(ctx, func() { s.projected(row) })
	return outbox.Write(ctx, tx, ev)
}

// cancellationMail is the subject and text of the email of a trip the
// traveler canceled: the fee kept and the amount refunded.
func cancellationMail(trip, name string, d events.TripSettledData) (string, string) {
	var fee, refund int64
	if d.FeeCents != nil {
		fee = *d.FeeCents
	}
	if d.RefundCents != nil {
		refund = *d.RefundCents
	}
	return "Your trip " + trip + " is canceled as you asked",
		"Hello " + name + ",\n\nyour trip is canceled: the room is released and the car booking canceled.\n" +
			"Cancellation fee: " + money(fee, d.Currency) + ". Refunded to your card: " + money(refund, d.Currency) + ".\n"
}

// money writes minor units in the currency's own decimals ("123.45 EUR",
// "12345 JPY"; two when the code is unknown to golang.org/x/text/currency).
func money(cents int64, code string) string {
	scale := 2
	if u, err := currency.ParseISO(code); err == nil {
		scale, _ = currency.Standard.Rounding(u)
	}
	sign := ""
	if cents < 0 {
		sign, cents = "-", -cents
	}
	if scale == 0 {
		return fmt.Sprintf("%s%d %s", sign, cents, oneLine(code))
	}
	div := int64(1)
	for range scale {
		div *= 10
	}
	return fmt.Sprintf("%s%d.%0*d %s", sign, cents/div, scale, cents%div, oneLine(code))
}
