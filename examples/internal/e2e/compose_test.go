package main

import (
	"net"
	"net/url"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/idemkit/watermill-idempotent/examples/internal/e2e/broker"
	"github.com/idemkit/watermill-idempotent/examples/internal/e2e/shop"
)

// composeFile is the part of a docker-compose.yml the examples rely on.
type composeFile struct {
	Services map[string]struct {
		Image       string            `yaml:"image"`
		Command     []string          `yaml:"command"`
		Ports       []string          `yaml:"ports"`
		Environment map[string]string `yaml:"environment"`
	} `yaml:"services"`
}

// TestComposeFiles parses each example's docker-compose.yml (no container
// runtime runs them here) and checks that it starts what the example's
// defaults address: each service's image, its published port equal to the
// port of the default URL, PostgreSQL's database and passwordless access
// as in the default DSN, JetStream on for NATS, and Kafka advertising the
// address a laptop reaches.
func TestComposeFiles(t *testing.T) {
	pg, err := url.Parse(shop.DefaultPostgresDSN)
	require.NoError(t, err)
	amqp, err := url.Parse(broker.DefaultAMQPURL)
	require.NoError(t, err)
	nats, err := url.Parse(broker.DefaultNATSURL)
	require.NoError(t, err)
	_, redisPort, err := net.SplitHostPort(broker.DefaultRedisAddr)
	require.NoError(t, err)
	require.Equal(t, shop.DefaultPostgresDSN, broker.DefaultSQLDSN, "the sql broker uses the inbox's database")

	// service -> image prefix and the port the default address uses
	type want struct{ image, port string }
	services := map[string]want{
		"postgres": {"postgres:", pg.Port()},
		"rabbitmq": {"rabbitmq:", amqp.Port()},
		"kafka":    {"apache/kafka:", "9092"}, // -kafka-brokers=127.0.0.1:9092 in the docs
		"nats":     {"nats:", nats.Port()},
		"redis":    {"redis:", redisPort},
	}
	// The examples' own defaults are the harness's.
	for dir, defaults := range map[string][]string{
		"../../rabbitmq": {broker.DefaultAMQPURL, shop.DefaultPostgresDSN},
		"../../kafka":    {shop.DefaultPostgresDSN},
	} {
		main, err := os.ReadFile(dir + "/main.go")
		require.NoError(t, err)
		for _, d := range defaults {
			require.Contains(t, string(main), `"`+d+`"`, "%s/main.go's default", dir)
		}
	}

	for file, names := range map[string][]string{
		"../../rabbitmq/docker-compose.yml": {"rabbitmq", "postgres"},
		"../../kafka/docker-compose.yml":    {"kafka", "postgres"},
		"docker-compose.yml":                {"postgres", "rabbitmq", "kafka", "nats", "redis"},
	} {
		t.Run(file, func(t *testing.T) {
			b, err := os.ReadFile(file)
			require.NoError(t, err)
			var c composeFile
			require.NoError(t, yaml.Unmarshal(b, &c))
			require.Len(t, c.Services, len(names), "services: %v", names)
			for _, name := range names {
				s, ok := c.Services[name]
				require.True(t, ok, "service %s", name)
				require.True(t, strings.HasPrefix(s.Image, services[name].image), "%s image %q", name, s.Image)
				require.Contains(t, s.Ports, services[name].port+":"+services[name].port, "%s publishes the default port", name)
				switch name {
				case "postgres":
					require.Equal(t, strings.TrimPrefix(pg.Path, "/"), s.Environment["POSTGRES_DB"])
					_, hasPassword := pg.User.Password()
					require.False(t, hasPassword)
					require.Equal(t, "trust", s.Environment["POSTGRES_HOST_AUTH_METHOD"], "the default DSN has no password")
				case "kafka":
					require.Contains(t, s.Environment["KAFKA_ADVERTISED_LISTENERS"], "PLAINTEXT://127.0.0.1:9092")
				case "nats":
					require.Contains(t, s.Command, "-js", "JetStream on")
				case "rabbitmq":
					require.Equal(t, "guest", amqp.User.Username(), "the image's default user")
				}
			}
		})
	}
}
