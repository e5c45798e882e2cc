package restarts

import (
	"testing"

	"github.com/dflow-dev/dflow/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }
