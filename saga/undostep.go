package saga

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/inbox"
	"github.com/tripsaga/tripsaga/provider"
)

// UndoRequest is the body recorded with an [UndoStep]'s row: the company
// record to undo, by the Idempotency-Key of the booking step that created
// it, and for a partial refund the amount.
type UndoRequest struct {
	TripID string `json:"trip_id"`
	// Key is the booking step's Idempotency-Key ("T-1:reserve", "T-1:charge").
	Key string `json:"key"`
	// AmountCents, when set, is sent as the undo's body {"amount_cents"}
	// (a partial refund, providers.md); 0 means nothing is to be refunded
	// and the company is not called.
	AmountCents *int64 `json:"amount_cents,omitempty"`
}

// UndoStep is a [Company] whose "create" is the undo, by key, of a record
// another step created: the customer's cancellation of a finished saga
// (a trip's: release the hold, cancel the booking, refund the charge in
// part) runs as forward-only steps of their own, each with its own
// Idempotency-Key in the step log, while the company is addressed by the
// booking step's key (POST /<resource>/{key}/<verb>, providers.md). A
// release, cancel or refund answered "none" (nothing under that key) is
// done as well: nothing is left in force.
//
// Its status is asked with the request ([StatusChecker]): the record under
// the booking key, reported as the company's undone word (the step's
// ActiveStatus must be [provider.Client.UndoneStatus]) once it is undone;
// a refund that names another refunded amount than asked is a
// [*provider.MismatchError].
type UndoStep struct {
	Client *provider.Client
}

func decodeUndo(body any) (UndoRequest, error) {
	var u UndoRequest
	var raw []byte
	switch b := body.(type) {
	case json.RawMessage:
		raw = b
	case []byte:
		raw = b
	default:
		var err error
		if raw, err = json.Marshal(body); err != nil {
			return u, err
		}
	}
	if err := json.Unmarshal(raw, &u); err != nil || u.Key == "" {
		return u, fmt.Errorf("saga: undo step: a body without the key to undo: %s", raw)
	}
	return u, nil
}

// Create undoes the record under the body's key ([UndoRequest]); Done
// when the company says it is undone or was never there.
func (u UndoStep) Create(ctx context.Context, _ string, body any) (provider.Result, error) {
	req, err := decodeUndo(body)
	if err != nil {
		return provider.Result{}, err
	}
	var send any
	if req.AmountCents != nil {
		if *req.AmountCents == 0 {
			return provider.Result{Outcome: provider.Done, Status: "nothing_to_refund"}, nil
		}
		send = map[string]int64{"amount_cents": *req.AmountCents}
	}
	res, err := u.Client.UndoWith(ctx, req.Key, send)
	if err != nil {
		return res, err
	}
	if res.Outcome == provider.Undone || res.Outcome == provider.None {
		res.Outcome = provider.Done
		if res.Status == "none" {
			res.Status = "none: nothing was in force"
		}
	}
	return res, nil
}

// Undo is never called: an UndoStep is forward-only.
func (u UndoStep) Undo(context.Context, string) (provider.Result, error) {
	return provider.Result{}, fmt.Errorf("saga: an undo step is forward-only and is never undone")
}

// Status cannot be asked without the request (the company knows the
// booking key, not the step's): see [UndoStep.StatusFor].
func (u UndoStep) Status(context.Context, string) (provider.Result, error) {
	return provider.Result{}, fmt.Errorf("%w: an undo step's status needs its request", provider.ErrUnknownOutcome)
}

// StatusFor asks the company about the record under the body's key: Done
// with the company's undone word once it is undone (with the refunded
// amount asked, for a partial refund), None when it has no record, Done
// with its word in force otherwise (so the undo is sent again).
func (u UndoStep) StatusFor(ctx context.Context, _ string, body any) (provider.Result, error) {
	req, err := decodeUndo(body)
	if err != nil {
		return provider.Result{}, err
	}
	if req.AmountCents != nil && *req.AmountCents == 0 {
		return provider.Result{Outcome: provider.Done, Status: u.Client.UndoneStatus}, nil
	}
	st, err := u.Client.Status(ctx, req.Key)
	if err != nil {
		return st, err
	}
	if st.Outcome == provider.Done && st.Status == u.Client.UndoneStatus && req.AmountCents != nil && st.RefundedCents != *req.AmountCents {
		return provider.Result{}, &provider.MismatchError{Op: "status", Field: "refunded_cents",
			Want: fmt.Sprint(*req.AmountCents), Got: fmt.Sprint(st.RefundedCents)}
	}
	return st, nil
}

// CancellationStep returns the forward-only step with which a service
// takes its part in the traveler's cancellation of a confirmed trip
// (events.TripCancellationRequested): undo, by the booking step's key
// "<trip>:<bookingKey>", what company c holds for the trip, under the
// step's own Idempotency-Key "<trip>:<name>", and publish onDone. With
// refund, the undo is a partial refund of the event's RefundCents. An
// event whose amounts do not add up (fee + refund != charged, or one
// negative) is parked (inbox.ErrPermanent) and nothing is called.
func CancellationStep(name, service, bookingKey string, c *provider.Client, onDone string, refund bool) ExtraStep {
	return ExtraStep{
		Spec: Spec{
			Name: name, Service: service, Class: events.ForwardOnly,
			Company: UndoStep{Client: c}, ActiveStatus: c.UndoneStatus, OnDone: onDone,
		},
		Request: func(e event.Event) (Request, error) {
			var d events.CancellationData
			if err := events.DecodeData(e, &d); err != nil {
				return Request{}, err
			}
			if d.TripID == "" || d.FeeCents < 0 || d.RefundCents < 0 || d.FeeCents+d.RefundCents != d.ChargedCents {
				return Request{}, fmt.Errorf("%w: %s of trip %q: fee_cents %d + refund_cents %d must be charged_cents %d, none negative",
					inbox.ErrPermanent, e.Type(), d.TripID, d.FeeCents, d.RefundCents, d.ChargedCents)
			}
			body := UndoRequest{TripID: d.TripID, Key: d.TripID + ":" + bookingKey}
			if refund {
				body.AmountCents = &d.RefundCents
			}
			carried, err := json.Marshal(d.Request)
			if err != nil {
				return Request{}, fmt.Errorf("saga: %s of trip %s: %w", e.Type(), d.TripID, err)
			}
			return Request{TripID: d.TripID, Body: body, Carried: carried}, nil
		},
	}
}
