package chaos

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/tripsaga/tripsaga/internal/demo"
)

// TripAudit is one trip as the audit found it.
type TripAudit struct {
	// TripOutcome holds the status (GET /trips) and the companies' records
	// by key: hold, charge, booking, the card statement's charge and
	// refund lines, the mails, and the verdict (demo.Verdict).
	demo.TripOutcome
	Traveler string `json:"traveler,omitempty"`
	// SettledAt is the trip's settled_at (GET /trips).
	SettledAt *time.Time `json:"settled_at,omitempty"`
	// Records counts the trip's records in each company's own list
	// (holds, charges, bookings, messages; policies with the insurance
	// step on).
	Records map[string]int `json:"records"`
	// Unfinished names the steps still pending, started, unknown or
	// compensating ("payment T-1:charge compensating").
	Unfinished []string `json:"unfinished,omitempty"`
	// Unreadable names what could not be read (never taken as "none").
	Unreadable []string `json:"unreadable,omitempty"`
	// Duplicates names every effect found more than once (set by the
	// audit).
	Duplicates []string `json:"duplicates,omitempty"`
}

// duplicates lists the effects the trip has more than once: more than one
// record of one step at a company (the insurer's policies included), more
// than one charge or refund line on the card, more than one mail.
func (a TripAudit) duplicates() []string {
	var out []string
	for _, d := range []struct {
		what string
		n    int
	}{
		{"hotel holds", a.Records["holds"]}, {"payments charges", a.Records["charges"]},
		{"payments charge lines", a.Charges}, {"payments refund lines", a.Refunds},
		{"cars bookings", a.Records["bookings"]}, {"mail messages", max(a.Records["messages"], a.Mails)},
		{"mail notices", a.Notices}, {"mail corrections", a.Corrections},
		{"insurer policies", a.Records["policies"]},
	} {
		if d.n > 1 {
			out = append(out, d.what+" "+strconv.Itoa(d.n))
		}
	}
	return out
}

// final reports whether the trip's status is final and no step of it is
// unfinished.
func (a TripAudit) final() bool {
	return (a.Status == "confirmed" || a.Status == "canceled") && len(a.Unfinished) == 0
}

// settled reports whether the trip is done and agrees with the companies:
// final, whole or empty, exactly one mail, nothing doubled, all readable.
func (a TripAudit) settled() bool {
	return a.final() && demo.Verdict(a.TripOutcome) != demo.Half && a.Mails == 1 && len(a.duplicates()) == 0 && len(a.Unreadable) == 0
}

// PostStats counts the run's POST /trips.
type PostStats struct {
	Posted int `json:"posted"`
	// Answered: 201 or 202 with a trip id, on some replica.
	Answered int `json:"answered"`
	// Retried: answered only after the same POST (same Idempotency-Key)
	// was sent again, to another replica.
	Retried int `json:"retried_elsewhere"`
	// Failed: never answered within two minutes, or refused (4xx).
	Failed int      `json:"failed"`
	Errors []string `json:"errors,omitempty"`
}

// MailStats counts the final mails per trip (confirmation or
// cancellation: exactly one is right), and the delay notices and
// corrections sent beside them (at most one of each per trip).
type MailStats struct {
	ExactlyOne  int `json:"exactly_one"`
	None        int `json:"none"`
	More        int `json:"more_than_one"`
	Notices     int `json:"notices,omitempty"`
	Corrections int `json:"corrections,omitempty"`
}

// Report is what a chaos run found. Its Problems are why it failed;
// [Report.Err] is nil when there are none.
type Report struct {
	Seed        uint64  `json:"seed"`
	DurationS   float64 `json:"duration_s"`
	Rate        float64 `json:"rate"`
	KillEveryS  float64 `json:"kill_every_s"`
	Replicas    int     `json:"replicas"`
	NATSCluster int     `json:"nats_cluster"`
	// Steps is the STEPS the system ran ("hotel,insurance,payment,car";
	// "" for the default three).
	Steps   string   `json:"steps,omitempty"`
	Victims []string `json:"victims"`

	Posts     PostStats      `json:"posts"`
	Travelers map[string]int `json:"travelers"`
	// Trips is the number of trips the system recorded (GET /trips).
	Trips     int `json:"trips"`
	Whole     int `json:"whole"`
	Empty     int `json:"empty"`
	Half      int `json:"half"`
	Unsettled int `json:"unsettled"`
	// Duplicates counts, per kind of effect, the trips that have it more
	// than once ("payments charge lines": trips charged twice); "trips
	// per Idempotency-Key" counts keys that made more than one trip.
	Duplicates      map[string]int `json:"duplicates"`
	DuplicatesTotal int            `json:"duplicates_total"`
	Mails           MailStats      `json:"mails"`
	// Settled: every trip settled within the limit. SettleAfterFaultsMS
	// is the time from the faults and kills stopping until the audit
	// found the last trip settled. LastFinalAfterFaultsMS is from the
	// same moment to the latest trip's settled_at (0 if all were final
	// before).
	Settled                bool      `json:"settled"`
	FaultsStoppedAt        time.Time `json:"faults_stopped_at"`
	SettleAfterFaultsMS    int64     `json:"settle_after_faults_ms"`
	LastFinalAfterFaultsMS int64     `json:"last_final_after_faults_ms"`

	// Incidents raised per service (GET /incidents), by service and kind,
	// and how many are still open.
	Incidents      map[string]int `json:"incidents"`
	IncidentKinds  map[string]int `json:"incident_kinds"`
	IncidentsTotal int            `json:"incidents_total"`
	IncidentsOpen  int            `json:"incidents_open"`
	// OverlappingCalls counts, per company, writes that arrived while
	// another write of the same Idempotency-Key was still in flight
	// (GET <company>/_stats): replicas must never call twice at once for
	// one key. -1: could not be read.
	OverlappingCalls      map[string]int64 `json:"overlapping_calls"`
	OverlappingCallsTotal int64            `json:"overlapping_calls_total"`
	// DeadLetters is the number of messages in the DEADLETTER stream (-1:
	// could not be read).
	DeadLetters int64 `json:"dead_letters"`
	// Faults counts how often each armed fault was drawn.
	Faults      map[string]int `json:"faults"`
	FaultsTotal int            `json:"faults_total"`
	// Kills counts the SIGKILLs per instance.
	Kills      map[string]int `json:"kills"`
	KillsTotal int            `json:"kills_total"`
	KillErrors []string       `json:"kill_errors,omitempty"`
	// DisruptionKinds are the kinds drawn (--faults), Disruptions how
	// many of each were carried out.
	DisruptionKinds []string       `json:"disruption_kinds"`
	Disruptions     map[string]int `json:"disruptions"`
	// LostEvents are the events deleted from their streams after their
	// PubAck (lose-acked) and whether each was found there again;
	// LostFoundAgain counts those found.
	LostEvents     []LostEvent `json:"lost_events,omitempty"`
	LostFoundAgain int         `json:"lost_found_again"`
	// Partitions is what the partitions did (the partition kind drawn;
	// nil otherwise): how many of each shape, how many fenced their
	// replica, how many leases peers took over meanwhile.
	Partitions *PartitionStats `json:"partitions,omitempty"`
	// PGHA: the run was on a PostgreSQL pair; PGFailovers are its
	// failovers (pg-failover), each with its time until writable.
	PGHA        bool         `json:"pg_ha,omitempty"`
	PGFailovers []PGFailover `json:"pg_failovers,omitempty"`

	// Orphans are company records of trips the trips service never
	// recorded ("holds T-9").
	Orphans []string `json:"orphans,omitempty"`

	// Bad lists the trips that are half, not settled, doubled, or without
	// exactly one mail (at most 20).
	Bad      []TripAudit `json:"bad_trips,omitempty"`
	Problems []string    `json:"problems,omitempty"`
}

// Err is nil when the run found nothing wrong, otherwise an error naming
// every problem.
func (r *Report) Err() error {
	if len(r.Problems) == 0 {
		return nil
	}
	return errors.New("chaos: " + strings.Join(r.Problems, "; "))
}

// summarize counts the audits into rep and lists its problems: any half
// trip, any duplicate, any trip not settled, any trip without exactly one
// mail, a trip answered to a POST that the system does not list, a POST
// the API refused.
func summarize(rep *Report, audits []TripAudit, bookings []*booking) {
	rep.Trips = len(audits)
	perTraveler := map[string]int{}
	listed := map[string]bool{}
	var lastFinal time.Time
	for i := range audits {
		a := &audits[i]
		listed[a.TripID] = true
		if a.SettledAt != nil && a.SettledAt.After(lastFinal) {
			lastFinal = *a.SettledAt
		}
		if a.Traveler != "" {
			perTraveler[a.Traveler]++
		}
		a.Duplicates = a.duplicates()
		bad := false
		switch {
		case !a.final():
			rep.Unsettled++
			bad = true
		case len(a.Unreadable) > 0 || demo.Verdict(a.TripOutcome) == demo.Half:
			a.Verdict = demo.Half
			rep.Half++
			bad = true
		case a.Verdict == demo.Whole:
			rep.Whole++
		default:
			rep.Empty++
		}
		for _, d := range a.Duplicates {
			rep.Duplicates[d[:strings.LastIndexByte(d, ' ')]]++
			rep.DuplicatesTotal++
			bad = true
		}
		rep.Mails.Notices += a.Notices
		rep.Mails.Corrections += a.Corrections
		switch {
		case a.Mails == 1:
			rep.Mails.ExactlyOne++
		case a.Mails == 0:
			rep.Mails.None++
			bad = true
		default:
			rep.Mails.More++
			bad = true
		}
		if bad && len(rep.Bad) < 20 {
			rep.Bad = append(rep.Bad, *a)
		}
	}
	for _, n := range perTraveler {
		if n > 1 {
			rep.Duplicates["trips per Idempotency-Key"]++
			rep.DuplicatesTotal++
		}
	}
	var lost []string
	for _, b := range bookings {
		if b.tripID != "" && !listed[b.tripID] {
			lost = append(lost, b.tripID)
		}
		if b.err != "" && b.code >= 400 && b.code < 500 && b.code != 429 {
			rep.Problems = append(rep.Problems, fmt.Sprintf("POST %s refused: %s", b.key, b.err))
		}
	}
	if !rep.FaultsStoppedAt.IsZero() && lastFinal.After(rep.FaultsStoppedAt) {
		rep.LastFinalAfterFaultsMS = lastFinal.Sub(rep.FaultsStoppedAt).Milliseconds()
	}
	if rep.Half > 0 {
		rep.Problems = append(rep.Problems, fmt.Sprintf("%d half trip(s)", rep.Half))
	}
	if rep.DuplicatesTotal > 0 {
		rep.Problems = append(rep.Problems, fmt.Sprintf("%d duplicate effect(s): %s", rep.DuplicatesTotal, countList(rep.Duplicates)))
	}
	if rep.OverlappingCallsTotal > 0 {
		rep.Problems = append(rep.Problems, fmt.Sprintf("%d call(s) made while another of the same Idempotency-Key was in flight", rep.OverlappingCallsTotal))
	}
	if rep.Unsettled > 0 {
		rep.Problems = append(rep.Problems, fmt.Sprintf("%d trip(s) not settled", rep.Unsettled))
	}
	if n := rep.Mails.None + rep.Mails.More; n > 0 {
		rep.Problems = append(rep.Problems, fmt.Sprintf("%d trip(s) without exactly one mail (%d none, %d more than one)", n, rep.Mails.None, rep.Mails.More))
	}
	if len(lost) > 0 {
		rep.Problems = append(rep.Problems, fmt.Sprintf("%d trip(s) answered but not listed by GET /trips: %s", len(lost), strings.Join(lost[:min(len(lost), 5)], ", ")))
	}
	if len(rep.Orphans) > 0 {
		rep.Problems = append(rep.Problems, fmt.Sprintf("%d company record(s) of trips nobody booked: %s", len(rep.Orphans), strings.Join(rep.Orphans[:min(len(rep.Orphans), 5)], ", ")))
	}
	if n := len(rep.LostEvents) - rep.LostFoundAgain; n > 0 {
		rep.Problems = append(rep.Problems, fmt.Sprintf("%d acked event(s) deleted from their streams never published again", n))
	}
	if rep.Trips == 0 {
		rep.Problems = append(rep.Problems, "no trip was booked")
	}
	if !rep.Settled && len(rep.Problems) == 0 {
		rep.Problems = append(rep.Problems, "the audit did not find every trip settled within the limit")
	}
}

func countList(m map[string]int) string {
	keys := slices.Sorted(maps.Keys(m))
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// Print writes the report for a person.
func (r *Report) Print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	cluster := "one embedded NATS server"
	if r.NATSCluster > 1 {
		cluster = fmt.Sprintf("a %d-node NATS cluster", r.NATSCluster)
	}
	steps := ""
	if r.Steps != "" {
		steps = ", steps " + r.Steps
	}
	fmt.Fprintf(tw, "run\t%s at %g trips/s, %d replica(s) of each service, %s, a kill every %s%s, seed %d\n",
		time.Duration(r.DurationS*float64(time.Second)), r.Rate, r.Replicas, cluster, time.Duration(r.KillEveryS*float64(time.Second)), steps, r.Seed)
	fmt.Fprintf(tw, "trips booked\t%d (POSTs %d: %d answered, %d of them retried on another replica, %d failed)\n",
		r.Trips, r.Posts.Posted, r.Posts.Answered, r.Posts.Retried, r.Posts.Failed)
	fmt.Fprintf(tw, "travelers\t%s\n", countList(r.Travelers))
	fmt.Fprintf(tw, "verdicts\twhole %d, empty %d, HALF %d\n", r.Whole, r.Empty, r.Half)
	fmt.Fprintf(tw, "not settled\t%d\n", r.Unsettled)
	fmt.Fprintf(tw, "duplicate effects\t%d (%s)\n", r.DuplicatesTotal, countList(r.Duplicates))
	if len(r.Orphans) > 0 {
		fmt.Fprintf(tw, "orphan records\t%d (%s)\n", len(r.Orphans), strings.Join(r.Orphans[:min(len(r.Orphans), 10)], ", "))
	}
	fmt.Fprintf(tw, "mails per trip\texactly one %d, none %d, more than one %d (final mails; besides them %d delay notice(s), %d correction(s))\n",
		r.Mails.ExactlyOne, r.Mails.None, r.Mails.More, r.Mails.Notices, r.Mails.Corrections)
	if r.Settled {
		fmt.Fprintf(tw, "settled after faults stopped\t%.1f s (the last trip final %.1f s after)\n", float64(r.SettleAfterFaultsMS)/1000, float64(r.LastFinalAfterFaultsMS)/1000)
	} else {
		fmt.Fprintf(tw, "settled after faults stopped\tNOT within the limit\n")
	}
	ov := make(map[string]int, len(r.OverlappingCalls))
	for k, v := range r.OverlappingCalls {
		ov[k] = int(v)
	}
	fmt.Fprintf(tw, "calls in flight twice\t%d (%s)\n", r.OverlappingCallsTotal, countList(ov))
	fmt.Fprintf(tw, "incidents raised\t%d, %d still open (%s)\n", r.IncidentsTotal, r.IncidentsOpen, countList(r.IncidentKinds))
	dl := strconv.FormatInt(r.DeadLetters, 10)
	if r.DeadLetters < 0 {
		dl = "unknown"
	}
	fmt.Fprintf(tw, "dead letters\t%s\n", dl)
	fmt.Fprintf(tw, "faults drawn\t%d (%s)\n", r.FaultsTotal, countList(r.Faults))
	fmt.Fprintf(tw, "disruptions\t%s (kinds drawn: %s)\n", countList(r.Disruptions), strings.Join(r.DisruptionKinds, ", "))
	fmt.Fprintf(tw, "kills\t%d (%s)\n", r.KillsTotal, countList(r.Kills))
	if r.PGHA {
		fmt.Fprintf(tw, "PostgreSQL failovers\t%d\n", len(r.PGFailovers))
		for _, f := range r.PGFailovers {
			fmt.Fprintf(tw, "\t%s %s -> %s: writable after %.1f s, old primary rejoined as standby after %.1f s\n",
				f.At.Format(time.TimeOnly), f.Killed, f.Promoted, float64(f.WritableMS)/1000, float64(f.RejoinedMS)/1000)
		}
	}
	if len(r.LostEvents) > 0 {
		fmt.Fprintf(tw, "acked events lost\t%d deleted from their streams, %d found there again\n", len(r.LostEvents), r.LostFoundAgain)
		for _, l := range r.LostEvents {
			if !l.FoundAgain {
				fmt.Fprintf(tw, "\tNOT found again: %s #%d %s (%s)\n", l.Stream, l.Seq, l.Subject, l.MsgID)
			}
		}
	}
	if p := r.Partitions; p != nil {
		n := 0
		for _, v := range p.Shapes {
			n += v
		}
		fmt.Fprintf(tw, "partitions\t%d (%s), longest %.1f s; the replica fenced itself in %d, leases taken over by a peer while cut %d\n",
			n, countList(p.Shapes), float64(p.LongestMS)/1000, p.Fenced, p.LeasesMoved)
	}
	for _, e := range r.KillErrors {
		fmt.Fprintf(tw, "\tkill error: %s\n", e)
	}
	for _, e := range r.Posts.Errors {
		fmt.Fprintf(tw, "\tPOST error: %s\n", e)
	}
	_ = tw.Flush()
	for _, a := range r.Bad {
		fmt.Fprintf(w, "  %s %s: hold %s, charge %s (%d charge/%d refund lines), car %s, %d mail(s)", a.TripID, a.Status, a.Hold, a.Charge, a.Charges, a.Refunds, a.Booking, a.Mails)
		if a.Policy != "" {
			fmt.Fprintf(w, ", policy %s", a.Policy)
		}
		if len(a.Unfinished) > 0 {
			fmt.Fprintf(w, "; unfinished: %s", strings.Join(a.Unfinished, ", "))
		}
		if len(a.Duplicates) > 0 {
			fmt.Fprintf(w, "; doubled: %s", strings.Join(a.Duplicates, ", "))
		}
		if len(a.Unreadable) > 0 {
			fmt.Fprintf(w, "; unreadable: %s", strings.Join(a.Unreadable, ", "))
		}
		fmt.Fprintln(w)
	}
	if len(r.Problems) == 0 {
		fmt.Fprintln(w, "RESULT: PASS (no half trip, nothing doubled, one mail per trip, every trip settled)")
		return
	}
	fmt.Fprintln(w, "RESULT: FAIL")
	for _, p := range r.Problems {
		fmt.Fprintln(w, "  - "+p)
	}
}
