package reconciler

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/process"
)

// Register mounts the write side on mux:
//
//	POST /api/actions           an action (ActionRequest); Authorization: Bearer <OPERATOR_TOKEN>, Idempotency-Key
//	GET  /api/actions           JSON {"items":[event...]}: recorded actions, newest first; ?trip= one trip's; ?limit= (default 100)
//	GET  /api/actions/{event_id}/outcome  JSON ActionOutcome: what the service that carries it out reported it did
//	GET  /api/deadletters       JSON {"items":[DeadLetter...]}: the parked events, oldest first (the newest 1000)
//	GET  /api/deadletters/{seq} JSON DeadLetter; 404 problem+json if there is none
//	POST /api/trips/{trip_id}/redrive  a re-drive of the trip from a step (RedriveFromRequest), JSON RedrivePlan; see serveRedriveFrom
func (o *Operator) Register(mux *http.ServeMux) {
	mux.HandleFunc("POST /api/actions", o.serveAction)
	mux.HandleFunc("GET /api/actions", o.serveActions)
	mux.HandleFunc("GET /api/actions/{event_id}/outcome", o.serveOutcome)
	mux.HandleFunc("GET /api/deadletters", o.serveDeadLetters)
	mux.HandleFunc("GET /api/deadletters/{seq}", o.serveDeadLetter)
	mux.HandleFunc("POST /api/trips/{trip_id}/redrive", o.serveRedriveFrom)
	o.registerBulk(mux)
}

// authorized compares the bearer token in constant time (of the tokens'
// sha256, so their lengths do not show either).
func (o *Operator) authorized(req *http.Request) bool {
	got, ok := strings.CutPrefix(req.Header.Get("Authorization"), "Bearer ")
	if !ok {
		return false
	}
	sum := sha256.Sum256([]byte(strings.TrimSpace(got)))
	return subtle.ConstantTimeCompare(sum[:], o.token[:]) == 1
}

func invalid(w http.ResponseWriter, req *http.Request, field, detail string) {
	process.WriteProblem(w, process.Problem{
		Type: process.ProblemInvalidInput, Title: "Invalid action", Status: http.StatusBadRequest,
		Detail: fmt.Sprintf("field %q: %s", field, detail), Instance: req.URL.EscapedPath(),
		Errors: []events.FieldError{events.FieldErr(field, detail)},
	})
}

// gate answers 503 when actions are disabled and 401 without the
// operator's bearer token, and reports whether req may act.
func (o *Operator) gate(w http.ResponseWriter, req *http.Request) bool {
	if !o.on {
		process.WriteProblem(w, process.Problem{Type: ProblemActionsDisabled, Title: "Operator actions are disabled", Status: http.StatusServiceUnavailable,
			Detail: "the reconciler was started without " + OperatorTokenEnv + "; set it to allow actions (reading needs no token)", Instance: req.URL.EscapedPath()})
		return false
	}
	if !o.authorized(req) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="tripsaga operator actions"`)
		process.WriteProblem(w, process.Problem{Type: ProblemUnauthorized, Title: "A valid operator token is required", Status: http.StatusUnauthorized,
			Detail: "send Authorization: Bearer <" + OperatorTokenEnv + ">", Instance: req.URL.EscapedPath()})
		return false
	}
	return true
}

// idempotencyKey returns req's Idempotency-Key, or answers 400 and
// returns false when it is missing or unusable.
func idempotencyKey(w http.ResponseWriter, req *http.Request) (string, bool) {
	key := req.Header.Get("Idempotency-Key")
	switch {
	case key == "":
		invalid(w, req, "Idempotency-Key", "header required: a key of your choosing, sent again with a retried request")
		return "", false
	case len(key) > MaxIdempotencyKeyChars || strings.ContainsFunc(key, func(r rune) bool { return r < ' ' || r == 0x7f }):
		invalid(w, req, "Idempotency-Key", fmt.Sprintf("at most %d characters, no control characters", MaxIdempotencyKeyChars))
		return "", false
	}
	return key, true
}

// decodeBody reads req's JSON body into v, refusing unknown fields, or
// answers 400 (413 past maxActionBody) naming the field and returns false.
func decodeBody(w http.ResponseWriter, req *http.Request, v any) bool {
	body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, maxActionBody))
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		process.WriteProblem(w, process.Problem{Type: "https://tripsaga.io/problems/body-too-large", Title: "Request body too large", Status: http.StatusRequestEntityTooLarge,
			Detail: fmt.Sprintf("an action is at most %d bytes", maxActionBody), Instance: req.URL.EscapedPath()})
		return false
	}
	if err != nil {
		invalid(w, req, "body", "reading the body: "+err.Error())
		return false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		field, detail := "body", "a JSON object of the action: "+err.Error()
		if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
			field, detail = strings.Trim(f, `"`), "unknown field"
		}
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			field, detail = te.Field, "want a "+te.Type.String()
		}
		var fe *FilterError
		if errors.As(err, &fe) {
			field, detail = "filter."+fe.Field, fe.Detail
		}
		invalid(w, req, field, detail)
		return false
	}
	return true
}

// writeActionError answers err of an action: an [ActionError] as its
// problem (400 naming the field), anything else by process.WriteError.
func (o *Operator) writeActionError(w http.ResponseWriter, req *http.Request, what string, err error) {
	var fe *ActionError
	switch {
	case errors.As(err, &fe) && fe.Status == http.StatusBadRequest:
		invalid(w, req, fe.Field, fe.Detail)
	case errors.As(err, &fe):
		process.WriteProblem(w, process.Problem{Type: fe.problemType(), Title: fe.title(), Status: fe.Status, Detail: fe.Detail, Instance: req.URL.EscapedPath()})
	default:
		process.WriteError(w, req, o.log, "reconciler: "+what, err)
	}
}

func (o *Operator) serveAction(w http.ResponseWriter, req *http.Request) {
	if !o.gate(w, req) {
		return
	}
	key, ok := idempotencyKey(w, req)
	if !ok {
		return
	}
	var ar ActionRequest
	if !decodeBody(w, req, &ar) {
		return
	}
	ev, replayed, err := o.Act(req.Context(), key, ar)
	if err != nil {
		o.writeActionError(w, req, "action", err)
		return
	}
	body, err := json.Marshal(ev)
	if err != nil {
		process.WriteError(w, req, o.log, "reconciler: action", err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	w.WriteHeader(http.StatusAccepted)
	_, _ = w.Write(append(body, '\n'))
}

func (o *Operator) serveActions(w http.ResponseWriter, req *http.Request) {
	limit := 100
	if s := req.URL.Query().Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 1000 {
			invalid(w, req, "limit", "a number from 1 to 1000")
			return
		}
		limit = n
	}
	evs, err := o.Actions(req.Context(), req.URL.Query().Get("trip"), limit)
	if err != nil {
		process.WriteError(w, req, o.log, "reconciler: actions", err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"items": evs})
}
