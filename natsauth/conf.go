package natsauth

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/natssync"
)

// ConfPath is the server configuration compose.yaml ships, relative to
// the repository root; [ServerConf] makes it and a test checks the
// committed file is current.
const ConfPath = "deploy/nats/nats-server.conf"

// Generator regenerates [ConfPath] and SECURITY.md's NATS table.
const Generator = "go run ./natsauth/cmd/natsauth"

// ConfInclude is where the server configuration includes the public keys
// from, relative to the configuration file: the folder [Provision] wrote
// (`tripsaga nats-auth --dir`), mounted there.
const ConfInclude = "auth/" + NkeysConf

// ServerConf is a nats-server configuration file (the server's own
// format) with the authorization of every identity of c: one nkey user
// each, its public key the variable [Provision] writes into
// auth/nkeys.conf, and its publish and subscribe allow lists; and the
// JetStream store's sync policy (natssync.ConfBlock), which the file-configured
// servers (compose) take from here.
func ServerConf(c events.Catalogue) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "# tripsaga's NATS users and what each may do. Generated from the event\n")
	fmt.Fprintf(&b, "# catalogue by natsauth (%s); do not edit.\n", Generator)
	fmt.Fprintf(&b, "# The public keys come from %s, which `tripsaga nats-auth --dir`\n", ConfInclude)
	fmt.Fprintf(&b, "# writes next to one seed file per identity (NATS_CREDS of each process).\n\n")
	fmt.Fprintf(&b, "include %q\n\n", ConfInclude)
	b.WriteString(natssync.ConfBlock + "\n")
	b.WriteString("authorization {\n  users = [\n")
	for _, id := range Identities(c) {
		fmt.Fprintf(&b, "    # %s\n", describe(id))
		fmt.Fprintf(&b, "    {\n      nkey: $%s\n      permissions: {\n", confVar(id.Name))
		list := func(what string, subs []string) {
			fmt.Fprintf(&b, "        %s: { allow: [\n", what)
			for _, s := range subs {
				fmt.Fprintf(&b, "          %q\n", s)
			}
			b.WriteString("        ] }\n")
		}
		list("publish", id.PublishAllow())
		list("subscribe", id.SubscribeAllow())
		b.WriteString("      }\n    }\n")
	}
	b.WriteString("  ]\n}\n")
	return b.Bytes()
}

func describe(id Identity) string {
	if id.All {
		return id.Name + ": the operator (tools, up's bootstrapping): everything"
	}
	var cs []string
	for _, c := range id.Consumers {
		cs = append(cs, c.Stream)
	}
	own := "no stream"
	if len(id.OwnStreams) > 0 {
		own = "stream " + strings.Join(id.OwnStreams, ", ")
	}
	return fmt.Sprintf("%s: owns %s; consumes %s", id.Name, own, orNone(strings.Join(cs, ", ")))
}

func orNone(s string) string {
	if s == "" {
		return "nothing"
	}
	return s
}
