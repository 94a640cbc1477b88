// Command asyncapi writes the AsyncAPI 3.0 document of the saga's events,
// generated from the catalogue of every event type (events.Full), the
// steps of both declared orders with every optional step on
// (events.FullOrders) and the Go data types of package events:
//
//	go run ./events/cmd/asyncapi            # writes events/asyncapi.yaml
//	go run ./events/cmd/asyncapi -o -       # prints it
//	go generate ./events                    # the same, from package events
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/events/asyncapi"
)

func main() {
	out := flag.String("o", asyncapi.Path, `file to write ("-": standard output)`)
	flag.Parse()
	b, err := asyncapi.Generate(events.Full(), events.FullOrders()...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "asyncapi:", err)
		os.Exit(1)
	}
	if *out == "-" {
		_, err = os.Stdout.Write(b)
	} else {
		err = os.WriteFile(*out, b, 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "asyncapi:", err)
		os.Exit(1)
	}
}
