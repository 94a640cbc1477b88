package sim_test

import (
	"context"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/provider/providertest"
	"github.com/tripsaga/tripsaga/sim"
)

// TestMemoryStoreContract runs the whole provider contract suite (faults
// included) against the simulators with their records in memory, as
// `serve sim --memory` runs them for the bench.
func TestMemoryStoreContract(t *testing.T) {
	sims, err := sim.New(context.Background(), sim.Config{Memory: true})
	require.NoError(t, err)
	srv := httptest.NewServer(sims.Handler())
	t.Cleanup(srv.Close)
	t.Cleanup(sims.Close) // runs first
	providertest.Run(t, providertest.Companies{
		HotelURL:    srv.URL + "/hotel",
		PaymentsURL: srv.URL + "/payments",
		CarsURL:     srv.URL + "/cars",
		MailURL:     srv.URL + "/mail",
		InsurerURL:  srv.URL + "/insurer",
	}, providertest.Features{Faults: true, DeclinedCardToken: sim.DeclinedCardToken})
}
