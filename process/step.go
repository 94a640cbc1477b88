package process

import (
	"context"
	"fmt"

	"golang.org/x/sync/errgroup"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/outbox"
	"github.com/tripsaga/tripsaga/saga"
	tripsql "github.com/tripsaga/tripsaga/sql"
)

// Timing returns the saga timing set by the environment.
func (e Env) Timing() saga.Timing {
	return saga.Timing{
		CallTimeout: e.CallTimeout, StepDeadline: e.StepDeadline, UndoBackoffMax: e.UndoBackoffMax,
		VerifyAfter: e.VerifyAfter, IncidentAfter: e.IncidentAfter,
	}
}

// RunStep runs a step service (hotel, payment, car, insurance) as this process until
// ctx ends: schema <service>, the saga migration set, the step's inboxes,
// relay and runner (and those of its extra steps: its part in the
// traveler's cancellation), and HTTP. It reports ready after the recovery
// pass.
func RunStep(ctx context.Context, env Env, spec saga.Spec, build saga.BuildFunc, companyVar string, extra ...saga.ExtraStep) error {
	if err := env.Require("NATS_URL", "DATABASE_URL", "HTTP_ADDR", companyVar); err != nil {
		return fmt.Errorf("%s: %w", spec.Service, err)
	}
	p, err := Open(ctx, spec.Service, spec.Service, env, true, tripsql.SetSaga)
	if err != nil {
		return fmt.Errorf("%s: %w", spec.Service, err)
	}
	defer p.Close()
	if err := p.ExportState(spec.Service); err != nil {
		return fmt.Errorf("%s: metrics: %w", spec.Service, err)
	}
	svc, err := saga.NewService(saga.ServiceConfig{
		Pool: p.Pool, JetStream: p.JS, Catalogue: env.Steps(), Family: events.TripVersions(), Spec: spec, Build: build,
		Timing: env.Timing(), Logger: p.Log, Registerer: p.Registry, Extra: extra,
		// A trigger from another step service runs only for a trip the
		// trips service took, with its request (SECURITY.md).
		Origin: saga.TripsOrigin(p.JS),
	})
	if err != nil {
		return err
	}
	p.HandleOps()
	p.AddInboxes(svc.Inboxes)
	p.AddDetail(func(ctx context.Context) ([]string, error) { return outbox.Details(ctx, p.Pool) })
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return p.Serve(ctx) })
	g.Go(func() error { return svc.Run(ctx, p.SetReady) })
	return g.Wait()
}
