package natssource_test

import (
	"context"
	"database/sql"
	"log"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" driver
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tenure-go/tenure/coordinator"
	"github.com/tenure-go/tenure/coordinator/worker"
	"github.com/tenure-go/tenure/coordinator/worker/natssource"
	"github.com/tenure-go/tenure/ownership/sqlfence"
)

// A consumer of a JetStream stream into PostgreSQL: the producer
// publishes each event to its key's partition's subject, and each node
// applies the partitions it owns, each event once.
func Example() {
	ctx := context.Background()
	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	stream, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.*"}})
	if err != nil {
		log.Fatal(err)
	}
	// The producer: the subject of the key's partition.
	if _, err := js.Publish(ctx, natssource.SubjectOf("orders", "customer-42", 64), []byte(`{"amount": 5}`)); err != nil {
		log.Fatal(err)
	}

	db, err := sql.Open("pgx", "postgres://postgres@127.0.0.1:5432/test")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(8) // the workers' MaxConcurrent
	db.SetMaxIdleConns(8)
	fence, _ := sqlfence.New(db, sqlfence.Postgres(), sqlfence.Config{})
	offsets, _ := sqlfence.NewOffsets(sqlfence.Postgres(), sqlfence.OffsetsConfig{})
	_ = fence.CreateSchema(ctx)
	_ = offsets.CreateSchema(ctx, db)

	src, err := natssource.New(natssource.Config{
		Stream: stream, Prefix: "orders", DB: db, Fence: fence, Offsets: offsets,
		Apply: func(ctx context.Context, tx sqlfence.Tx, p uint32, msgs []jetstream.Msg) error {
			for _, m := range msgs {
				if _, err := tx.ExecContext(ctx, `INSERT INTO orders (body) VALUES ($1)`, m.Data()); err != nil {
					return err
				}
			}
			return nil
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	rt, err := worker.New(worker.Config{MaxConcurrent: 8, Process: src.Process, Stop: src.Stop})
	if err != nil {
		log.Fatal(err)
	}
	defer rt.Close() // after the coordinator's Close or Leave

	cfg := coordinator.LANConfig()
	cfg.Name = "node-1"
	cfg.Ring.Partitions = 64
	cfg.Handler = rt
	cfg.Fence = fence
	c, err := coordinator.New(cfg)
	if err != nil {
		log.Fatal(err)
	}
	rt.Bind(c)
	if err := c.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer c.Leave(ctx) // each worker commits the batch in hand first
}
