package saga_test

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestShopCatalogueIsValid: the catalogue ExampleNewService runs is one a
// process accepts (its own file: example_test.go holds only the example,
// so that the documentation shows that file whole).
func TestShopCatalogueIsValid(t *testing.T) {
	require.NoError(t, ShopCatalogue().Validate())
}
