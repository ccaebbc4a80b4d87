package testenv

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// recorder is a testing.TB that keeps what Missing reports.
type recorder struct {
	testing.TB
	msg string
}

func (r *recorder) Helper()                        {}
func (r *recorder) Skipf(format string, a ...any)  { r.msg = fmt.Sprintf(format, a...) }
func (r *recorder) Fatalf(format string, a ...any) { r.msg = fmt.Sprintf(format, a...) }

// A service that does not answer is named with its setting, the
// password masked, in the message and in the driver's error.
func TestMissingMasksThePassword(t *testing.T) {
	const pw = "Hunter2Secret"
	r := &recorder{TB: t}
	url := "amqp://guest:" + pw + "@127.0.0.1:1/"
	MissingAt(r, "RabbitMQ", AMQPEnv, url, errors.New("dial "+url+": refused"))
	require.Contains(t, r.msg, "RabbitMQ (AMQP_URL=amqp://guest:xxxxx@127.0.0.1:1/)")
	require.Contains(t, r.msg, "dial amqp://guest:xxxxx@127.0.0.1:1/: refused")
	require.NotContains(t, r.msg, pw)
}
