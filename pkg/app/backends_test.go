package app

import (
	"bytes"
	"strings"
	"testing"

	"k8s.io/klog/v2/textlogger"

	"github.com/sluiceproxy/sluice/pkg/model"
)

func TestFamiliesAreLoggedByName(t *testing.T) {
	var buf bytes.Buffer
	logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(&buf)))
	logger.Info("Starting sluice", "families", familyNames([]model.IPFamily{model.IPv4, model.IPv6}))
	if got := buf.String(); !strings.Contains(got, `families=["IPv4","IPv6"]`) {
		t.Errorf("log line %q does not name the families", got)
	}
}
