package natsauth

import (
	"errors"
	"fmt"
	"strings"

	"github.com/tripsaga/tripsaga/events"
)

// SecurityPath is the document whose NATS region [SecurityTable] fills,
// relative to the repository root.
const SecurityPath = "SECURITY.md"

// The markers of SECURITY.md's NATS region: the line starting with
// RegionBegin and the line RegionEnd. What lies between is [SecurityTable].
const (
	RegionBegin = "<!-- nats:begin"
	RegionEnd   = "<!-- nats:end -->"
)

// SecurityTable is SECURITY.md's table of the identities of c: for each,
// what it publishes, what it subscribes to and the JetStream API it may
// call, as Markdown.
func SecurityTable(c events.Catalogue) string {
	var b strings.Builder
	b.WriteString("Generated from the event catalogue by `natsauth` (`" + Generator + "`);\n")
	b.WriteString("a test fails when it differs from what the tests, `tripsaga up` and\n")
	b.WriteString("compose's `" + ConfPath + "` configure. Every process connects as\n")
	b.WriteString("its own NATS user (a user nkey whose seed file `NATS_CREDS` names); a\n")
	b.WriteString("subject not listed is refused by the server (a permissions violation:\n")
	b.WriteString("no PubAck, no subscription). `*` is the trip id (one token).\n\n")
	b.WriteString("| identity | publishes | subscribes | JetStream API |\n|---|---|---|---|\n")
	for _, id := range Identities(c) {
		if id.All {
			fmt.Fprintf(&b, "| `%s` | everything (`>`) | everything (`>`) | everything: the operator's tools (`doctor`, `replay`, `streams apply`, chaos, bench) and `tripsaga up`, which create every stream before the services start; no service runs as it |\n", id.Name)
			continue
		}
		pub := codes(id.Events)
		if len(id.DeadLetters) > 0 {
			pub += "; dead letters " + codes(id.DeadLetters)
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", id.Name, orNone(pub), codes(id.SubscribeAllow()), api(id))
	}
	return b.String()
}

func codes(ss []string) string {
	var out []string
	for _, s := range ss {
		out = append(out, "`"+s+"`")
	}
	return strings.Join(out, ", ")
}

func api(id Identity) string {
	var parts []string
	if len(id.OwnStreams) > 0 {
		parts = append(parts, "creates and updates stream "+strings.Join(id.OwnStreams, ", ")+" and reads its messages by sequence (the outbox's verify)")
	}
	if len(id.CreateStreams) > 0 {
		parts = append(parts, "creates "+strings.Join(id.CreateStreams, ", ")+" when missing (never updates it)")
	}
	if len(id.Consumers) > 0 {
		var ss []string
		for _, c := range id.Consumers {
			ss = append(ss, c.Stream)
		}
		parts = append(parts, fmt.Sprintf("its consumer `%s` on %s: create, update, info, delete, next, ack", id.Name, strings.Join(ss, ", ")))
	}
	parts = append(parts, "reads the info and consumer list of "+strings.Join(id.ReadStreams, ", "))
	if len(id.GetStreams) > 0 {
		parts = append(parts, "reads messages of "+strings.Join(id.GetStreams, ", "))
	}
	return strings.Join(parts, "; ")
}

// ErrNoRegion is returned by [ReplaceRegion] for a document without the
// region's markers.
var ErrNoRegion = errors.New("natsauth: no " + RegionBegin + " ... " + RegionEnd + " region")

// Region returns what lies between the NATS region's marker lines of doc.
func Region(doc string) (string, error) {
	_, body, _, err := split(doc)
	return body, err
}

// ReplaceRegion returns doc with what lies between the NATS region's
// marker lines replaced by body.
func ReplaceRegion(doc, body string) (string, error) {
	head, _, tail, err := split(doc)
	if err != nil {
		return "", err
	}
	return head + body + tail, nil
}

// split cuts doc after the begin marker's line and before the end marker.
func split(doc string) (head, body, tail string, err error) {
	i := strings.Index(doc, RegionBegin)
	if i < 0 {
		return "", "", "", ErrNoRegion
	}
	nl := strings.IndexByte(doc[i:], '\n')
	if nl < 0 {
		return "", "", "", ErrNoRegion
	}
	start := i + nl + 1
	j := strings.Index(doc[start:], RegionEnd)
	if j < 0 {
		return "", "", "", ErrNoRegion
	}
	return doc[:start], doc[start : start+j], doc[start+j:], nil
}
