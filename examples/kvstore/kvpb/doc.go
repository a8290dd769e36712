// Package kvpb holds the generated Go code of the kvstore example's gRPC
// service (kv.proto): KV.Put and KV.Get, served by every kvstore node
// (package kvnode) for any key.
//
// The generated files are committed. To regenerate them after editing
// kv.proto, install protoc (3.21 or later; Debian: apt-get install
// protobuf-compiler) and the two plugins, then run go generate from the
// module root:
//
//	go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
//	go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.5.1
//	go generate ./examples/kvstore/kvpb
package kvpb

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative kv.proto
