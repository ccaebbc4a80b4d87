package eventhubs_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/idemkit/watermill-idempotent/examples/eventhubs"
	"github.com/idemkit/watermill-idempotent/examples/internal/ledger"
	"github.com/idemkit/watermill-idempotent/examples/kafkaproducer"
	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/internal/testsupport/testenv"
	"github.com/idemkit/watermill-idempotent/middleware"
)

const connectionString = "Endpoint=sb://shop.servicebus.windows.net/;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=c2VjcmV0"

func TestBrokers(t *testing.T) {
	brokers, err := eventhubs.Brokers(connectionString)
	require.NoError(t, err)
	require.Equal(t, []string{"shop.servicebus.windows.net:9093"}, brokers)
	_, err = eventhubs.Brokers("SharedAccessKeyName=k;SharedAccessKey=s")
	require.ErrorIs(t, err, eventhubs.ErrNoEndpoint)
}

func TestSaramaConfig(t *testing.T) {
	sc := eventhubs.SaramaConfig(sarama.NewConfig(), connectionString)
	require.NoError(t, sc.Validate())
	require.True(t, sc.Net.TLS.Enable, "Event Hubs accepts TLS only")
	require.True(t, sc.Net.SASL.Enable)
	require.Equal(t, sarama.SASLMechanism(sarama.SASLTypePlaintext), sc.Net.SASL.Mechanism)
	require.Equal(t, "$ConnectionString", sc.Net.SASL.User)
	require.Equal(t, connectionString, sc.Net.SASL.Password)
	require.True(t, sc.Version.IsAtLeast(sarama.V1_0_0_0))
}

// kfakeConfig is SaramaConfig as the tests can use it against kfake: TLS
// off (kfake listens in plain text here) and the protocol version kfake
// accepts from Sarama.
func kfakeConfig(sc *sarama.Config, conn string) *sarama.Config {
	sc = eventhubs.SaramaConfig(sc, conn)
	sc.Net.TLS.Enable, sc.Net.TLS.Config = false, nil
	sc.Version = sarama.V2_3_0_0
	return sc
}

// TestSASLRefusesAWrongConnectionString checks that the kfake cluster
// really authenticates: the connection string gets in, another key is
// refused (kfake closes the connection, so Sarama runs out of brokers).
func TestSASLRefusesAWrongConnectionString(t *testing.T) {
	cluster := saslCluster(t)
	client, err := sarama.NewClient(cluster.ListenAddrs(), kfakeConfig(sarama.NewConfig(), connectionString))
	require.NoError(t, err)
	require.NoError(t, client.Close())
	sc := kfakeConfig(sarama.NewConfig(), connectionString+"x")
	sc.Metadata.Retry.Max = 0
	_, err = sarama.NewClient(cluster.ListenAddrs(), sc)
	require.ErrorIs(t, err, sarama.ErrOutOfBrokers)
}

func saslCluster(t *testing.T) *kfake.Cluster {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.EnableSASL(),
		kfake.Superuser("PLAIN", eventhubs.ConnectionStringUser, connectionString),
		kfake.SeedTopics(4, "orders"))
	require.NoError(t, err)
	t.Cleanup(cluster.Close)
	return cluster
}

// TestInboxThroughSASL publishes 12 orders (4 of them twice with the same
// UUID, as a producer does when an answer is lost) with the idempotent
// producer through SASL PLAIN, and consumes them in consumer group
// "billing" behind the inbox: 12 ledger rows. Then it deletes the group —
// its checkpoints — as a rewind or a lost checkpoint store does: the 16
// events are delivered again and the inbox acknowledges them all as
// duplicates; the ledger still has 12 rows.
func TestInboxThroughSASL(t *testing.T) {
	cluster := saslCluster(t)
	brokers := cluster.ListenAddrs()
	db, _ := testenv.PostgresSchema(t, "exeventhubs_")
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	repo, err := ledger.Migrate(ctx, db)
	require.NoError(t, err)

	pub, err := kafka.NewPublisher(kafka.PublisherConfig{
		Brokers: brokers, Marshaler: kafka.DefaultMarshaler{},
		OverwriteSaramaConfig: kfakeConfig(kafkaproducer.Idempotent(kafka.DefaultSaramaSyncPublisherConfig()), connectionString),
	}, watermill.NopLogger{})
	require.NoError(t, err)
	defer pub.Close()
	published := 0
	for i := range 12 {
		msg := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, "order %d", i))
		for range 1 + i%3/2 {
			require.NoError(t, pub.Publish("orders", msg.Copy()))
			published++
		}
	}
	require.Equal(t, 16, published)

	outcomes := &ledger.Outcomes{}
	inbox, err := middleware.NewInbox(repo, middleware.Config{Consumer: "shop", Observer: outcomes})
	require.NoError(t, err)

	consume(ctx, t, brokers, inbox, outcomes, published)
	rows, distinct, err := ledger.Count(ctx, db)
	require.NoError(t, err)
	require.Equal(t, [2]int{12, 12}, [2]int{rows, distinct})
	require.Equal(t, 4, outcomes.Count(idempotency.OutcomeDuplicate)+outcomes.Count(idempotency.OutcomeReplayed))

	admin, err := sarama.NewClusterAdmin(brokers, kfakeConfig(sarama.NewConfig(), connectionString))
	require.NoError(t, err)
	defer admin.Close()
	require.NoError(t, admin.DeleteConsumerGroup("billing"))

	consume(ctx, t, brokers, inbox, outcomes, 2*published)
	rows, distinct, err = ledger.Count(ctx, db)
	require.NoError(t, err)
	require.Equal(t, [2]int{12, 12}, [2]int{rows, distinct})
	require.Equal(t, 4+published, outcomes.Count(idempotency.OutcomeDuplicate)+outcomes.Count(idempotency.OutcomeReplayed))
}

// consume runs handler "billing" on consumer group "billing" behind inbox
// until outcomes has counted acked acknowledged deliveries, then stops it.
func consume(ctx context.Context, t *testing.T, brokers []string, inbox *middleware.Inbox, outcomes *ledger.Outcomes, acked int) {
	t.Helper()
	sc := kfakeConfig(kafka.DefaultSaramaSubscriberConfig(), connectionString)
	sc.Consumer.Offsets.Initial = sarama.OffsetOldest
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers: brokers, Unmarshaler: kafka.DefaultMarshaler{}, OverwriteSaramaConfig: sc, ConsumerGroup: "billing",
	}, watermill.NopLogger{})
	require.NoError(t, err)
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	require.NoError(t, err)
	router.AddMiddleware(inbox.Middleware)
	router.AddConsumerHandler("billing", "orders", sub, ledger.Record)
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { _ = router.Run(runCtx) })
	defer func() { stop(); wg.Wait(); require.NoError(t, sub.Close()) }()
	require.NoError(t, outcomes.WaitAcked(ctx, acked))
}
