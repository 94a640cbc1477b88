package reconciler

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/tripsaga/tripsaga/events"
)

// SearchHit is a trip [Reconciler.Search] found and what matched: "trip
// id", "Idempotency-Key", "traveler email", "step key" or "company
// record".
type SearchHit struct {
	TripID  string `json:"trip_id"`
	Matched string `json:"matched"`
}

// searchable refuses a query no trip id, key, email or record id can
// match: one that is not UTF-8 or holds a control character (U+0000 to
// U+001F, U+007F to U+009F). Asking the trips service with it only made
// it answer 400, which the search then called unread.
func searchable(q string) error {
	if !utf8.ValidString(q) {
		return errors.New("q: is not UTF-8")
	}
	if i := strings.IndexFunc(q, unicode.IsControl); i >= 0 {
		r, _ := utf8.DecodeRuneInString(q[i:])
		return fmt.Errorf("q: holds the control character %U at byte %d; give a trip id, an Idempotency-Key, a traveler's email or a company record id", r, i)
	}
	return nil
}

// Search finds the trips q names: a trip id the projection knows, a step's
// Idempotency-Key ("<trip>:hotel"), a trip request's Idempotency-Key or a
// traveler's email (asked of the trips service's GET /ops/trips), or,
// when none of those matched, a company record id or key (hold_id,
// charge_id, booking_id: the companies' lists are read). Each trip is
// listed once, with its first match. Sources that could not be asked are in unread.
func (r *Reconciler) Search(ctx context.Context, q string) (hits []SearchHit, unread []string) {
	q = strings.TrimSpace(q)
	hits = []SearchHit{}
	if q == "" || searchable(q) != nil {
		return hits, nil // nothing searched holds a control character
	}
	seen := map[string]bool{}
	hit := func(trip, matched string) {
		if !seen[trip] {
			seen[trip] = true
			hits = append(hits, SearchHit{trip, matched})
		}
	}
	known := func(trip string) bool {
		if events.ValidateTripID(trip) != nil {
			return false
		}
		_, err := r.View(ctx, trip)
		return err == nil
	}
	if known(q) {
		hit(q, "trip id")
	}
	if i := strings.LastIndex(q, ":"); i > 0 && known(q[:i]) {
		hit(q[:i], "step key")
	}
	if base, ok := r.cfg.Services["trips"]; ok {
		var body struct {
			Items []struct {
				TripID  string `json:"trip_id"`
				Matched string `json:"matched"`
			} `json:"items"`
		}
		if err := getJSON(ctx, base+"/ops/trips?q="+url.QueryEscape(q), &body); err != nil {
			unread = append(unread, "trips: "+err.Error())
		}
		for _, it := range body.Items {
			hit(it.TripID, map[string]string{"email": "traveler email", "idempotency_key": "Idempotency-Key"}[it.Matched])
		}
	} else {
		unread = append(unread, "trips: its URL is not known ("+ServiceURLsEnv+"), so no Idempotency-Key or email search")
	}
	if len(hits) > 0 {
		return hits, unread // the companies' lists are long: read them only when nothing else matched
	}
	for _, c := range r.clients() {
		recs, err := c.List(ctx, "")
		if err != nil {
			unread = append(unread, c.Company+": "+err.Error())
			continue
		}
		for _, rec := range recs {
			if rec.TripID() == "" {
				continue
			}
			if s, _ := rec[c.IDField].(string); s == q || rec.Key() == q {
				hit(rec.TripID(), "company record")
			}
		}
	}
	return hits, unread
}
