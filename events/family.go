package events

import "fmt"

// Family is every catalogue a saga's events may be of, by version. A
// saga keeps the version it started with ([VersionExtension] on each of
// its events, "" on those from before versions), so a service reads each
// event by its own version's catalogue, not only by the one it runs: the
// trip's are the orders of [Versions]. A saga with one catalogue is
// [Single]'s.
type Family interface {
	// Of returns the catalogue of version ("" is the saga's first, the
	// version of an event that carries none); an unknown version is an
	// error wrapping [ErrInvalidCatalogue].
	Of(version string) (Catalogue, error)
	// All returns every catalogue of the family, the first one first: a
	// step's inboxes take what it needs in any of them.
	All() []Catalogue
	// Union declares every event type any version may publish, on its
	// stream: what the outbox may write and the services' streams hold.
	Union() Catalogue
}

// TripVersions returns the trip's family: [CatalogueOf], [Versions] and
// [Full].
func TripVersions() Family { return tripVersions{} }

type tripVersions struct{}

func (tripVersions) Of(version string) (Catalogue, error) { return CatalogueOf(version) }
func (tripVersions) All() []Catalogue                     { return Versions() }
func (tripVersions) Union() Catalogue                     { return Full() }

// Single returns the family of a saga with one catalogue, c: its
// version is "" or c.Version().
func Single(c Catalogue) Family { return single{c} }

type single struct{ c Catalogue }

func (s single) Of(version string) (Catalogue, error) {
	if version != "" && version != s.c.Version() {
		return Catalogue{}, fmt.Errorf("%w: version %q (this saga has one: %q)", ErrInvalidCatalogue, version, s.c.Version())
	}
	return s.c, nil
}
func (s single) All() []Catalogue { return []Catalogue{s.c} }
func (s single) Union() Catalogue { return s.c }
