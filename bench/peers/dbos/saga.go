package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"sync/atomic"
	"time"

	"github.com/dbos-inc/dbos-transact-golang/dbos"
)

// TripRequest is the body of POST /trips, the same JSON as tripsaga's
// (docs/contracts/trips-api.md): money in integer cents, dates YYYY-MM-DD.
type TripRequest struct {
	Traveler struct {
		Name  string `json:"name"`
		Email string `json:"email"`
	} `json:"traveler"`
	Hotel struct {
		PropertyID string `json:"property_id"`
		CheckIn    string `json:"check_in"`
		Nights     int    `json:"nights"`
	} `json:"hotel"`
	Car struct {
		CarClass string `json:"car_class"`
		Pickup   string `json:"pickup"`
		Return   string `json:"return"`
	} `json:"car"`
	Payment struct {
		CardToken   string `json:"card_token"`
		AmountCents int64  `json:"amount_cents"`
		Currency    string `json:"currency"`
	} `json:"payment"`
}

// check names the first missing field of r, as tripsaga's trips API does.
func (r TripRequest) check() error {
	switch {
	case r.Traveler.Name == "":
		return errors.New("traveler.name: required")
	case r.Traveler.Email == "":
		return errors.New("traveler.email: required")
	case r.Hotel.PropertyID == "":
		return errors.New("hotel.property_id: required")
	case r.Hotel.CheckIn == "":
		return errors.New("hotel.check_in: required (YYYY-MM-DD)")
	case r.Hotel.Nights < 1:
		return errors.New("hotel.nights: want at least 1")
	case r.Car.CarClass == "":
		return errors.New("car.car_class: required")
	case r.Car.Pickup == "" || r.Car.Return == "":
		return errors.New("car.pickup, car.return: required (YYYY-MM-DD)")
	case r.Payment.CardToken == "":
		return errors.New("payment.card_token: required")
	case r.Payment.AmountCents < 1:
		return errors.New("payment.amount_cents: want at least 1 (cents)")
	case r.Payment.Currency == "":
		return errors.New("payment.currency: required (ISO 4217)")
	}
	return nil
}

// TripInput is the workflow's input: the trip's id and request.
type TripInput struct {
	TripID  string      `json:"trip_id"`
	Request TripRequest `json:"request"`
}

// TripResult is the workflow's output: "confirmed" or "canceled", with the
// business rejection that canceled the trip.
type TripResult struct {
	TripID string `json:"trip_id"`
	Status string `json:"status"`
	Reason string `json:"reason,omitempty"`
}

// Outcome is what a company decided on a create call. A call whose outcome
// is unknown (5xx, no answer, a connection error, an answer that does not
// read) is no Outcome: it is a step error, which DBOS retries.
type Outcome struct {
	Done   bool   `json:"done"`
	Reason string `json:"reason,omitempty"` // sold_out, declined, ...
}

// companies are the base URLs of the four companies
// (docs/contracts/providers.md).
type companies struct {
	hotel, payments, cars, mail string
	client                      *http.Client
	log                         *slog.Logger
}

// errUnknown marks an outcome the company did not decide (retried).
var errUnknown = errors.New("outcome unknown")

// Retry policies. A create step is asked again by key (the same request
// with the same Idempotency-Key answers the first answer again) up to its
// deadline, about 20 s; an undo or the mail is retried until it succeeds,
// as tripsaga's compensations are, and a named incident is logged past
// undoIncidentAfter attempts.
const (
	createRetries     = 10
	undoRetries       = 1 << 30
	undoIncidentAfter = 20
)

// tripWorkflow is the saga: hold the hotel, charge the card, book the car;
// on a business rejection (or an outcome still unknown at the step's
// deadline) undo the steps done so far, newest first, by the keys that
// made them; then mail the traveler the final outcome.
func (cs *companies) tripWorkflow(ctx dbos.Context, in TripInput) (TripResult, error) {
	id, r := in.TripID, in.Request
	res := TripResult{TripID: id, Status: "confirmed"}
	type undo struct{ name, path string }
	var undos []undo
	steps := []struct {
		name, url, key string
		body           any
		want           string // status word of a done answer
		undo           undo
	}{
		{"hold hotel", cs.hotel + "/holds", id + ":hotel", map[string]any{
			"trip_id": id, "property_id": r.Hotel.PropertyID, "check_in": r.Hotel.CheckIn, "nights": r.Hotel.Nights,
			"guest": map[string]string{"name": r.Traveler.Name, "email": r.Traveler.Email},
		}, "held", undo{"release hotel", cs.hotel + "/holds/" + url.PathEscape(id+":hotel") + "/release"}},
		{"charge card", cs.payments + "/charges", id + ":charge", map[string]any{
			"trip_id": id, "amount_cents": r.Payment.AmountCents, "currency": r.Payment.Currency, "card_token": r.Payment.CardToken,
		}, "charged", undo{"refund card", cs.payments + "/charges/" + url.PathEscape(id+":charge") + "/refund"}},
		{"book car", cs.cars + "/bookings", id + ":car", map[string]any{
			"trip_id": id, "car_class": r.Car.CarClass, "pickup": r.Car.Pickup, "return": r.Car.Return,
			"driver": map[string]string{"name": r.Traveler.Name, "email": r.Traveler.Email},
		}, "booked", undo{"cancel car", cs.cars + "/bookings/" + url.PathEscape(id+":car") + "/cancel"}},
	}
	for _, s := range steps {
		out, err := dbos.RunAsStep(ctx, func(sctx context.Context) (Outcome, error) {
			return cs.create(sctx, s.url, s.key, s.body, s.want)
		}, dbos.WithStepName(s.name), dbos.WithStepMaxRetries(createRetries),
			dbos.WithStepBaseInterval(100*time.Millisecond), dbos.WithStepMaxInterval(3*time.Second),
			dbos.WithStepRetryPredicate(func(err error) bool { return errors.Is(err, errUnknown) }))
		switch {
		case err != nil && (isCanceled(err) || ctx.Err() != nil):
			return res, err // canceled or shutting down: the workflow resumes on recovery
		case err != nil:
			// Still unknown at the step's deadline: undo it too (an undo of
			// a key the company never saw changes nothing).
			undos = append(undos, s.undo)
			res.Status, res.Reason = "canceled", s.name+": outcome unknown at the deadline"
		case !out.Done:
			res.Status, res.Reason = "canceled", out.Reason
		default:
			undos = append(undos, s.undo)
			continue
		}
		break
	}
	if res.Status == "canceled" {
		for i := len(undos) - 1; i >= 0; i-- {
			u := undos[i]
			var attempts atomic.Int64
			if _, err := dbos.RunAsStep(ctx, func(sctx context.Context) (bool, error) {
				return true, cs.undo(sctx, u.path, id, u.name, attempts.Add(1))
			}, dbos.WithStepName(u.name), dbos.WithStepMaxRetries(undoRetries),
				dbos.WithStepBaseInterval(100*time.Millisecond), dbos.WithStepMaxInterval(5*time.Second)); err != nil {
				return res, err
			}
		}
	}
	var attempts atomic.Int64
	if _, err := dbos.RunAsStep(ctx, func(sctx context.Context) (bool, error) {
		return true, cs.sendMail(sctx, id, r, res, attempts.Add(1))
	}, dbos.WithStepName("mail "+res.Status), dbos.WithStepMaxRetries(undoRetries),
		dbos.WithStepBaseInterval(100*time.Millisecond), dbos.WithStepMaxInterval(5*time.Second)); err != nil {
		return res, err
	}
	return res, nil
}

func isCanceled(err error) bool {
	var de *dbos.Error
	return errors.As(err, &de) && de.Code == dbos.ErrorCodeWorkflowCancelled
}

// create POSTs body to u with Idempotency-Key key. 201/200 with status
// want is done; 409 (sold out), 402 (declined) and 422 (bad request, key
// reused) are business rejections, never retried; anything else is
// [errUnknown].
func (cs *companies) create(ctx context.Context, u, key string, body any, want string) (Outcome, error) {
	code, b, err := cs.post(ctx, u, key, body)
	if err != nil {
		return Outcome{}, fmt.Errorf("%w: %s: %v", errUnknown, key, err)
	}
	var ans struct {
		Key    string `json:"key"`
		Status string `json:"status"`
		Reason string `json:"reason"`
		Error  string `json:"error"`
	}
	jerr := json.Unmarshal(b, &ans)
	switch {
	case (code == http.StatusCreated || code == http.StatusOK) && jerr == nil && ans.Key == key && ans.Status == want:
		return Outcome{Done: true}, nil
	case code == http.StatusConflict || code == http.StatusPaymentRequired:
		return Outcome{Reason: ans.Status}, nil
	case code == http.StatusUnprocessableEntity:
		return Outcome{Reason: "refused: " + ans.Error}, nil
	}
	return Outcome{}, fmt.Errorf("%w: %s: HTTP %d %.200s", errUnknown, key, code, b)
}

// undo POSTs an undo (release, refund, cancel) by the original key; only a
// 200 ends it.
func (cs *companies) undo(ctx context.Context, u, tripID, name string, attempt int64) error {
	code, b, err := cs.post(ctx, u, "", nil)
	if err == nil && code == http.StatusOK {
		return nil
	}
	if attempt == undoIncidentAfter {
		cs.log.Error("incident: compensation_stuck", "trip_id", tripID, "step", name, "attempts", attempt)
	}
	if err != nil {
		return fmt.Errorf("%s %s: %w", name, tripID, err)
	}
	return fmt.Errorf("%s %s: HTTP %d %.200s", name, tripID, code, b)
}

func (cs *companies) sendMail(ctx context.Context, id string, r TripRequest, res TripResult, attempt int64) error {
	text := "Your trip " + id + " is " + res.Status + "."
	if res.Reason != "" {
		text += " Reason: " + res.Reason + "."
	}
	key := id + ":mail:" + res.Status
	code, b, err := cs.post(ctx, cs.mail+"/messages", key, map[string]string{
		"to": r.Traveler.Email, "subject": "Trip " + id + " " + res.Status, "text": text, "trip_id": id,
	})
	if err == nil && code == http.StatusAccepted {
		return nil
	}
	if attempt == undoIncidentAfter {
		cs.log.Error("incident: mail_stuck", "trip_id", id, "attempts", attempt)
	}
	if err != nil {
		return fmt.Errorf("mail %s: %w", key, err)
	}
	return fmt.Errorf("mail %s: HTTP %d %.200s", key, code, b)
}

// post sends one POST with a JSON body (none when body is nil) and returns
// the status and body of the answer.
func (cs *companies) post(ctx context.Context, u, key string, body any) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, rd)
	if err != nil {
		return 0, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := cs.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return 0, nil, err
	}
	return resp.StatusCode, b, nil
}
