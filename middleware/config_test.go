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
	valid := middleware.Config{DB: db, Repository: repo, Consumer: "billing"}

	_, err = middleware.NewInbox(valid)
	require.NoError(t, err, "defaults make a minimal config valid")

	for name, tc := range map[string]struct {
		mutate func(*middleware.Config)
		want   string
	}{
		"no DB":              {func(c *middleware.Config) { c.DB = nil }, "missing Config.DB"},
		"no repository":      {func(c *middleware.Config) { c.Repository = nil }, "missing Config.Repository"},
		"no consumer":        {func(c *middleware.Config) { c.Consumer = "" }, "missing Config.Consumer"},
		"long consumer":      {func(c *middleware.Config) { c.Consumer = strings.Repeat("c", 256) }, "at most 255 bytes"},
		"negative retention": {func(c *middleware.Config) { c.Retention = -time.Hour }, "Retention must be positive"},
		"retention shorter than redelivery window": {func(c *middleware.Config) {
			c.Retention = time.Hour
			c.RedeliveryWindow = 2 * time.Hour
		}, "shorter than RedeliveryWindow"},
		"default retention shorter than redelivery window": {func(c *middleware.Config) {
			c.RedeliveryWindow = 8 * 24 * time.Hour
		}, "shorter than RedeliveryWindow"},
		"negative redelivery window": {func(c *middleware.Config) { c.RedeliveryWindow = -1 }, "must not be negative"},
	} {
		t.Run(name, func(t *testing.T) {
			c := valid
			tc.mutate(&c)
			_, err := middleware.NewInbox(c)
			require.ErrorContains(t, err, tc.want)
		})
	}

	c := valid
	c.Retention, c.RedeliveryWindow = 24*time.Hour, 24*time.Hour
	_, err = middleware.NewInbox(c)
	require.NoError(t, err, "retention equal to the redelivery window is enough")
}
