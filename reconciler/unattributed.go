package reconciler

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/provider"
)

// FindingUnattributed: a company record whose trip_id is missing, not a
// string, or not a trip id: the sweep cannot join it with any trip, so it
// is a finding of its own, named by the company and the record's id (its
// TripID is "?<company>/<record id>", never a trip's).
const FindingUnattributed = "unattributed"

// unattributedPrefix starts the TripID of an unattributed finding.
const unattributedPrefix = "?"

// unattributed says why rec cannot be attributed to a trip, or "" when it
// can: its trip_id is missing, is not a string, or is not a trip id.
func unattributed(rec provider.Record) string {
	v, ok := rec["trip_id"]
	switch s, isStr := v.(string); {
	case !ok || v == nil:
		return "has no trip_id"
	case !isStr:
		return fmt.Sprintf("has a trip_id that is not a string (%T %v)", v, v)
	case events.ValidateTripID(s) != nil:
		return fmt.Sprintf("has a trip_id %q that is not a trip id", s)
	}
	return ""
}

// recordID names a record by the company's id field, else its key.
func recordID(c *provider.Client, rec provider.Record) string {
	if id, ok := rec[c.IDField].(string); ok && id != "" {
		return id
	}
	if k := rec.Key(); k != "" {
		return k
	}
	return "(no id)"
}

// addUnattributed records rec, which cannot be attributed to a trip (why),
// among out's records under its own key, as an unattributed finding.
func addUnattributed(out map[string]*companyRecords, c *provider.Client, rec provider.Record, why string) {
	id := recordID(c, rec)
	key := unattributedPrefix + c.Company + "/" + id
	out[key] = &companyRecords{
		unattributed: fmt.Sprintf("%s record %s %s (status %q, key %q): the sweep cannot join it with a trip",
			c.Company, id, why, rec.Status(), rec.Key()),
	}
}

// UnreadableError is the error of a sweep that could not read the records
// of one or more companies: Companies maps each to what went wrong. Such a
// sweep judges nothing (a partial list would resolve findings that still
// hold) and says so on the page and in
// tripsaga_reconciler_company_unreadable.
type UnreadableError struct {
	Companies map[string]string
}

func (e *UnreadableError) Error() string {
	var parts []string
	for _, c := range slices.Sorted(maps.Keys(e.Companies)) {
		parts = append(parts, c+": "+e.Companies[c])
	}
	return "sweep: could not read the records of " + strings.Join(parts, "; ")
}

// unreadableMetric is tripsaga_reconciler_company_unreadable{company}.
func unreadableMetric() *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "tripsaga_reconciler_company_unreadable",
		Help: "1 when the last sweep could not read the company's records (and so judged nothing), else 0.",
	}, []string{"company"})
}

// readErrors turns the companies' list errors (by index of clients) into
// an [UnreadableError], sets the unreadable gauge of every company, and
// returns nil when all were read.
func (r *Reconciler) readErrors(clients []*provider.Client, errs []error) error {
	bad := map[string]string{}
	for i, c := range clients {
		v := 0.0
		if errs[i] != nil {
			bad[c.Company] = errs[i].Error()
			v = 1
		}
		r.metrics.unreadable.WithLabelValues(c.Company).Set(v)
	}
	if len(bad) == 0 {
		return nil
	}
	return &UnreadableError{Companies: bad}
}

// unreadableOf returns the companies an error of the sweep could not read.
func unreadableOf(err error) map[string]string {
	var ue *UnreadableError
	if errors.As(err, &ue) {
		return ue.Companies
	}
	return nil
}
