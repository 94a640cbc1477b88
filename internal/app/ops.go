package app

import (
	"encoding/json"
	"net/http"

	"github.com/tripsaga/tripsaga/saga"
)

// HandleOps serves the step log for operators: GET /incidents and
// GET /steps/{trip_id}.
func (p *Process) HandleOps() {
	p.Mux.HandleFunc("GET /incidents", func(w http.ResponseWriter, r *http.Request) {
		items, err := saga.Incidents(r.Context(), p.Pool)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"items": items})
	})
	p.Mux.HandleFunc("GET /steps/{trip_id}", func(w http.ResponseWriter, r *http.Request) {
		items, err := saga.Steps(r.Context(), p.Pool, r.PathValue("trip_id"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"items": items})
	})
}
