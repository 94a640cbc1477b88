package trips

import (
	"errors"
	"net/http"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/tripsaga/tripsaga/process"
	"github.com/tripsaga/tripsaga/services/trips/internal/dbsqlc"
)

// lookupMax is how many trips GET /ops/trips answers at most.
const lookupMax = 20

// LookupHit is one trip GET /ops/trips found, and what matched:
// "idempotency_key" or "email".
type LookupHit struct {
	TripID  string `json:"trip_id"`
	Matched string `json:"matched"`
}

// HandleLookup mounts GET /ops/trips?q=... on mux, for the operators'
// search (the reconciler's dashboard asks it): the trip created with the
// Idempotency-Key q, and the newest 20 trips whose traveler's email is q
// (without case), as JSON {"items":[LookupHit...]}. A missing or empty q is
// 400 problem+json naming the field; PostgreSQL unreachable is 503.
func (s *Service) HandleLookup(mux *http.ServeMux) {
	mux.HandleFunc("GET /ops/trips", s.lookup)
}

func (s *Service) lookup(w http.ResponseWriter, r *http.Request) {
	q := strings.TrimSpace(r.URL.Query().Get("q"))
	if q == "" {
		writeProblem(w, Problem{Type: problemInvalidQuery, Title: "Invalid query", Status: http.StatusBadRequest,
			Errors: []FieldError{{Field: "q", Pointer: "query:q", Detail: "must be an Idempotency-Key or a traveler's email"}}})
		return
	}
	out := struct {
		Items []LookupHit `json:"items"`
	}{Items: []LookupHit{}}
	row, err := queries.TripGetByIdempotencyKey(r.Context(), s.cfg.Pool, &q)
	switch {
	case err == nil:
		out.Items = append(out.Items, LookupHit{TripID: row.TripID, Matched: "idempotency_key"})
	case !errors.Is(err, pgx.ErrNoRows):
		process.WriteError(w, r, s.log, "lookup trips", err)
		return
	}
	if strings.Contains(q, "@") {
		ids, err := queries.TripFindByEmail(r.Context(), s.cfg.Pool, dbsqlc.TripFindByEmailParams{Email: q, Max: lookupMax})
		if err != nil {
			process.WriteError(w, r, s.log, "lookup trips", err)
			return
		}
		for _, id := range ids {
			out.Items = append(out.Items, LookupHit{TripID: id, Matched: "email"})
		}
	}
	writeJSON(w, http.StatusOK, out)
}
