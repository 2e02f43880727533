// Loads the project's proto subset (packages/epp/proto) for the server, the tests and the bench.
import * as grpc from "@grpc/grpc-js";
import * as loader from "@grpc/proto-loader";
import { fileURLToPath } from "node:url";

export const PROTO_DIR = fileURLToPath(new URL("../../proto", import.meta.url));

// keepCase: field names as in the .proto (snake_case). google.protobuf.Struct comes from protobufjs'
// bundled descriptors, whose fields are camelCase (fields, stringValue, structValue, listValue).
const OPTIONS: loader.Options = { keepCase: true, longs: String, enums: String, defaults: false, oneofs: true, includeDirs: [PROTO_DIR] };

type ServiceCtor = grpc.ServiceClientConstructor;

let cached: { extProc: ServiceCtor; health: ServiceCtor } | undefined;

export function loadProtos(): { extProc: ServiceCtor; health: ServiceCtor } {
  if (cached) return cached;
  const def = loader.loadSync(["envoy/service/ext_proc/v3/external_processor.proto", "grpc/health/v1/health.proto"], OPTIONS);
  const pkg = grpc.loadPackageDefinition(def) as unknown as {
    envoy: { service: { ext_proc: { v3: { ExternalProcessor: ServiceCtor } } } };
    grpc: { health: { v1: { Health: ServiceCtor } } };
  };
  cached = { extProc: pkg.envoy.service.ext_proc.v3.ExternalProcessor, health: pkg.grpc.health.v1.Health };
  return cached;
}

export const EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor";
