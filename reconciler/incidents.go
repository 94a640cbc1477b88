package reconciler

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"

	"github.com/tripsaga/tripsaga/saga"
)

// ServiceIncident is an incident with the service that raised it.
type ServiceIncident struct {
	Service string `json:"service"`
	saga.Incident
}

// serviceIncidents reads GET <base>/incidents.
func (r *Reconciler) serviceIncidents(ctx context.Context, name, base string) ([]ServiceIncident, error) {
	var body struct {
		Items []saga.Incident `json:"items"`
	}
	if err := getJSON(ctx, base+"/incidents", &body); err != nil {
		return nil, err
	}
	out := make([]ServiceIncident, 0, len(body.Items))
	for _, in := range body.Items {
		out = append(out, ServiceIncident{Service: name, Incident: in})
	}
	return out, nil
}

// Incidents gathers the incidents of every service ([Config.Services]),
// open ones first then by age, oldest first; unread names the services
// that did not answer.
func (r *Reconciler) Incidents(ctx context.Context) (items []ServiceIncident, unread []string) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	items = []ServiceIncident{}
	for name, base := range r.cfg.Services {
		wg.Go(func() {
			got, err := r.serviceIncidents(ctx, name, base)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				unread = append(unread, fmt.Sprintf("%s: %v", name, err))
				return
			}
			items = append(items, got...)
		})
	}
	wg.Wait()
	if len(r.cfg.Services) == 0 {
		unread = append(unread, "the services' URLs are not known ("+ServiceURLsEnv+")")
	}
	slices.SortFunc(items, func(a, b ServiceIncident) int {
		return cmp.Or(cmp.Compare(boolInt(a.ResolvedAt != nil), boolInt(b.ResolvedAt != nil)), a.RaisedAt.Compare(b.RaisedAt))
	})
	sort.Strings(unread)
	return items, unread
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
