package providertest_test

import (
	"context"
	"flag"
	"net/http/httptest"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/provider/providertest"
	"github.com/tripsaga/tripsaga/sim"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// External mode: check someone else's implementation instead of our
// simulators, e.g.
//
//	go test ./provider/providertest -count=1 -run TestExternal -args \
//		-hotel-url=http://host:9000/hotel -payments-url=http://host:9000/payments \
//		-cars-url=http://host:9000/cars -mail-url=http://host:9000/mail
//
// or HOTEL_URL, PAYMENTS_URL, CARS_URL, MAIL_URL with CONTRACT_EXTERNAL=1
// (CONTRACT_FAULTS=1, CONTRACT_DECLINED_CARD_TOKEN, CONTRACT_CARD_TOKEN for
// the features). Flags win over the environment.
var (
	hotelURL    = flag.String("hotel-url", "", "external mode: base URL of the hotel (else $HOTEL_URL with CONTRACT_EXTERNAL=1)")
	paymentsURL = flag.String("payments-url", "", "external mode: base URL of the card processor (else $PAYMENTS_URL)")
	carsURL     = flag.String("cars-url", "", "external mode: base URL of the car firm (else $CARS_URL)")
	mailURL     = flag.String("mail-url", "", "external mode: base URL of the mail relay (else $MAIL_URL)")
	insurerURL  = flag.String("insurer-url", "", "external mode: base URL of the travel insurer (else $INSURER_URL)")
	faults      = flag.Bool("faults", false, "external mode: the companies accept fault rules at POST <base>/_faults (else CONTRACT_FAULTS=1)")
	declined    = flag.String("declined-card-token", "", "external mode: a card token always declined (else $CONTRACT_DECLINED_CARD_TOKEN)")
	cardToken   = flag.String("card-token", "", "external mode: the card token of charges that succeed; empty: a fresh one per test (else $CONTRACT_CARD_TOKEN)")
)

// external returns the companies and features of external mode, and whether
// it was asked for.
func external() (providertest.Companies, providertest.Features, bool) {
	env := os.Getenv("CONTRACT_EXTERNAL") == "1"
	pick := func(flagValue, envName string) string {
		if flagValue != "" || !env {
			return flagValue
		}
		return os.Getenv(envName)
	}
	c := providertest.Companies{
		HotelURL:    pick(*hotelURL, "HOTEL_URL"),
		PaymentsURL: pick(*paymentsURL, "PAYMENTS_URL"),
		CarsURL:     pick(*carsURL, "CARS_URL"),
		MailURL:     pick(*mailURL, "MAIL_URL"),
		InsurerURL:  pick(*insurerURL, "INSURER_URL"),
	}
	f := providertest.Features{
		Faults:            *faults || (env && os.Getenv("CONTRACT_FAULTS") == "1"),
		DeclinedCardToken: pick(*declined, "CONTRACT_DECLINED_CARD_TOKEN"),
		CardToken:         pick(*cardToken, "CONTRACT_CARD_TOKEN"),
	}
	on := env || *hotelURL != "" || *paymentsURL != "" || *carsURL != "" || *mailURL != "" || *insurerURL != ""
	return c, f, on
}

// TestSimulators runs the contract suite against the project's simulators.
func TestSimulators(t *testing.T) {
	if _, _, on := external(); on {
		t.Skip("external mode: see TestExternal")
	}
	sims, err := sim.New(context.Background(), sim.Config{DatabaseURL: testenv.Postgres(t)})
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
	}, providertest.Features{
		Faults:            true,
		DeclinedCardToken: sim.DeclinedCardToken,
	})
}

// TestExternal runs the contract suite against the companies given by flags
// or the environment; it is skipped when none are.
func TestExternal(t *testing.T) {
	c, f, on := external()
	if !on {
		t.Skip("no external companies given: pass -hotel-url=… (or HOTEL_URL=… CONTRACT_EXTERNAL=1)")
	}
	if c == (providertest.Companies{}) {
		t.Fatal("external mode, but no company URL given")
	}
	providertest.Run(t, c, f)
}
