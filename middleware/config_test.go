package middleware_test

import (
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/repository/sqlite"
)

func TestConfigValidate(t *testing.T) {
	db := &sql.DB{}
	repo, err := sqlite.NewRepository(db, sqlite.Config{})
	require.NoError(t, err)
	valid := middleware.Config{Consumer: "billing"}
	_, err = middleware.NewInbox(repo, valid)
	require.NoError(t, err, "defaults make a minimal config valid")

	// No driver: refused, with the configuration's own problems.
	_, err = middleware.NewInbox[*sql.Tx](nil, middleware.Config{Consumer: "bill\x00ing"})
	require.ErrorContains(t, err, "NewInbox needs a repository.Driver")
	require.ErrorContains(t, err, "Config.Consumer contains a NUL byte")

	for name, tc := range map[string]struct {
		mutate func(*middleware.Config)
		want   string
	}{
		"long consumer":      {func(c *middleware.Config) { c.Consumer = strings.Repeat("c", 256) }, "Config.Consumer is 256 bytes, longer than 255"},
		"consumer with NUL":  {func(c *middleware.Config) { c.Consumer = "bill\x00ing" }, "Config.Consumer contains a NUL byte"},
		"consumer not UTF-8": {func(c *middleware.Config) { c.Consumer = "bill\xffing" }, "Config.Consumer is not valid UTF-8"},
		"empty handler name": {func(c *middleware.Config) { c.HandlerScopes = map[string]string{"": "billing"} }, "the empty handler name never matches"},
		"empty mapped scope": {func(c *middleware.Config) { c.HandlerScopes = map[string]string{"billing": ""} }, `Config.HandlerScopes["billing"] is empty`},
		"long mapped scope": {func(c *middleware.Config) {
			c.HandlerScopes = map[string]string{"billing": strings.Repeat("s", 256)}
		}, `Config.HandlerScopes["billing"] is 256 bytes`},
		"negative retention": {func(c *middleware.Config) { c.Retention = -time.Hour }, "Retention must be positive"},
		"retention shorter than redelivery window": {func(c *middleware.Config) {
			c.Retention = time.Hour
			c.RedeliveryWindow = 2 * time.Hour
		}, "shorter than RedeliveryWindow"},
		"default retention shorter than redelivery window": {func(c *middleware.Config) {
			c.RedeliveryWindow = 8 * 24 * time.Hour
		}, "shorter than RedeliveryWindow"},
		"negative redelivery window": {func(c *middleware.Config) { c.RedeliveryWindow = -1 }, "must not be negative"},
		// Seconds of retention is a mistake unless the window is declared
		// that short: the default window (1 h) refuses it.
		"retention shorter than the default window": {func(c *middleware.Config) { c.Retention = time.Second }, "config.Retention (1s) is shorter than RedeliveryWindow (1h0m0s)"},
	} {
		t.Run(name, func(t *testing.T) {
			c := valid
			tc.mutate(&c)
			_, err := middleware.NewInbox(repo, c)
			require.ErrorContains(t, err, tc.want)
		})
	}

	c := valid
	c.Retention, c.RedeliveryWindow = 24*time.Hour, 24*time.Hour
	_, err = middleware.NewInbox(repo, c)
	require.NoError(t, err, "retention equal to the redelivery window is enough")

	c = valid
	c.Retention, c.RedeliveryWindow = time.Second, time.Second
	_, err = middleware.NewInbox(repo, c)
	require.NoError(t, err, "a short retention with the window declared as short")

	// A negative Retention is reported once, as not positive, not as
	// shorter than the window.
	c = valid
	c.Retention = -time.Second
	_, err = middleware.NewInbox(repo, c)
	require.ErrorContains(t, err, "Retention must be positive")
	require.NotContains(t, err.Error(), "shorter than RedeliveryWindow")
}
