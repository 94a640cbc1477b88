// A consumer and producer of tripsaga's events written with Node's
// CloudEvents SDK (npm "cloudevents") and the NATS JetStream client
// ("@nats-io/transport-node" + "@nats-io/jetstream"), run by interop_test.go.
//
// 1. Consume: reads every message of the streams named in the expectations
//    file ($EXPECTED) with an ordered consumer, maps each one to a CloudEvent
//    as the NATS protocol binding says for binary content mode (every
//    attribute in its own "ce-<name>" header, percent-decoded as UTF-8; the
//    data in the body, here application/json), builds it with the SDK's
//    CloudEvent class in strict mode (the SDK validates it against the
//    CloudEvents 1.0 schema), and checks every attribute and the data
//    against what the Go side sent.
// 2. Produce: builds CloudEvents with the SDK (non-ASCII subject and
//    extension, a source whose non-ASCII is in its URI form, and one
//    event, made without the SDK's strict check, whose source is a raw
//    non-ASCII IRI), encodes them the same way and publishes them to
//    $PUBLISH_SUBJECT with JetStream (Nats-Msg-Id = id, as our relay does).
//
// It prints one JSON report on stdout ({received, sent, errors}) and exits
// 1 when anything disagreed.
import { readFileSync } from "node:fs";
import { isDeepStrictEqual } from "node:util";
import { CloudEvent } from "cloudevents";
import { connect, headers, nkeyAuthenticator } from "@nats-io/transport-node";
import { jetstream } from "@nats-io/jetstream";

const PREFIX = "ce-";

// percentDecode: the binding's header values are percent-encoded UTF-8.
function percentDecode(v) {
  return decodeURIComponent(v);
}

// percentEncode: space, '"', '%' and every byte outside printable ASCII
// become %XX of their UTF-8 bytes (NATS protocol binding, binary mode).
function percentEncode(s) {
  let out = "";
  for (const b of Buffer.from(s, "utf8")) {
    if (b <= 0x20 || b > 0x7e || b === 0x22 || b === 0x25) {
      out += "%" + b.toString(16).toUpperCase().padStart(2, "0");
    } else {
      out += String.fromCharCode(b);
    }
  }
  return out;
}

// toCloudEvent maps one NATS message to a CloudEvent with the SDK.
function toCloudEvent(m) {
  const attrs = {};
  for (const k of m.headers ? m.headers.keys() : []) {
    const lk = k.toLowerCase();
    if (lk.startsWith(PREFIX)) {
      attrs[lk.slice(PREFIX.length)] = percentDecode(m.headers.get(k));
    }
  }
  let data;
  if (m.data.length > 0) {
    const ct = attrs.datacontenttype || "";
    if (!ct.startsWith("application/json")) {
      throw new Error(`datacontenttype ${JSON.stringify(ct)} is not application/json`);
    }
    data = JSON.parse(new TextDecoder().decode(m.data));
  }
  const ev = new CloudEvent({ ...attrs, data }, true); // strict: validated
  return { attrs, data, ev };
}

function toHeaders(ev) {
  const h = headers();
  for (const [name, v] of Object.entries(ev)) {
    if (name === "data" || name === "data_base64" || v === undefined) continue;
    h.set(PREFIX + name, percentEncode(String(v)));
  }
  return h;
}

const errors = [];
const received = [];
const sent = [];
const expected = JSON.parse(readFileSync(process.env.EXPECTED, "utf8"));
// NATS_CREDS names the seed file of the NATS identity to connect as (the
// servers the tests start require one, internal/natsauth).
const authenticator = process.env.NATS_CREDS
  ? nkeyAuthenticator(new TextEncoder().encode(readFileSync(process.env.NATS_CREDS, "utf8").trim()))
  : undefined;
const nc = await connect({ servers: process.env.NATS_URL.split(","), name: "interop-node", authenticator });
const js = jetstream(nc);

try {
  // 1. Consume what the Go side published, stream by stream.
  const want = new Map(expected.events.map((e) => [e.attributes.id, e]));
  for (const stream of expected.streams) {
    const n = expected.events.filter((e) => e.stream === stream).length;
    const c = await js.consumers.get(stream); // no name: an ordered consumer
    for (let i = 0; i < n; i++) {
      const m = await c.next({ expires: 5000 });
      if (!m) {
        errors.push(`${stream}: only ${i} of ${n} messages`);
        break;
      }
      let got;
      try {
        got = toCloudEvent(m);
      } catch (err) {
        errors.push(`${stream} #${m.seq} ${m.subject}: the SDK refused it: ${err.message} ${JSON.stringify(err.errors ?? "")}`);
        continue;
      }
      const { attrs, data, ev } = got;
      received.push({ stream, nats_subject: m.subject, attributes: attrs, data });
      const w = want.get(attrs.id);
      if (!w) {
        errors.push(`${stream}: unexpected event ${attrs.id}`);
        continue;
      }
      want.delete(attrs.id);
      if (m.subject !== w.nats_subject) errors.push(`${attrs.id}: NATS subject ${m.subject}, sent ${w.nats_subject}`);
      if (!isDeepStrictEqual(Object.keys(attrs).sort(), Object.keys(w.attributes).sort())) {
        errors.push(`${attrs.id}: attributes ${Object.keys(attrs).sort()}, sent ${Object.keys(w.attributes).sort()}`);
      }
      for (const [k, v] of Object.entries(w.attributes)) {
        if (attrs[k] !== v) errors.push(`${attrs.id}: ${k} ${JSON.stringify(attrs[k])}, sent ${JSON.stringify(v)}`);
        if (k !== "time" && ev[k] !== v) errors.push(`${attrs.id}: the SDK's ${k} ${JSON.stringify(ev[k])}, sent ${JSON.stringify(v)}`);
      }
      if (new Date(ev.time).getTime() !== new Date(w.attributes.time).getTime()) {
        errors.push(`${attrs.id}: the SDK's time ${ev.time}, sent ${w.attributes.time}`);
      }
      if (!isDeepStrictEqual(ev.data, w.data)) {
        errors.push(`${attrs.id}: data ${JSON.stringify(ev.data)}, sent ${JSON.stringify(w.data)}`);
      }
    }
  }
  for (const id of want.keys()) errors.push(`never received ${id}`);

  // 2. Produce events for the Go side's codec.
  const trip = expected.publish.trip_id;
  const base = {
    type: expected.publish.type,
    datacontenttype: "application/json",
    time: new Date().toISOString(),
    data: expected.publish.data,
  };
  const evs = [
    // Validated by the SDK: the source's non-ASCII in its URI form.
    new CloudEvent({
      ...base,
      id: "node-1",
      source: "/partners/h%C3%B4tel-z%C3%BCrich",
      subject: `${trip} Zürich → 東京 «100% "sûr"»`,
      dataschema: "https://example.com/schemas/trip-requested?v=1&lang=fr",
      partnername: "Hôtel Zürich 東京 50% \"off\"",
    }),
    // A raw non-ASCII source (an IRI, not a URI-reference): the SDK's
    // strict check refuses it, so it is built without; the binding still
    // carries it.
    new CloudEvent({ ...base, id: "node-2", source: "/partners/hôtel-zürich", subject: "Ωmega ✓" }, false),
  ];
  for (const ev of evs) {
    const ack = await js.publish(process.env.PUBLISH_SUBJECT, JSON.stringify(ev.data), {
      headers: toHeaders(ev),
      msgID: ev.id,
    });
    const attrs = {};
    for (const [k, v] of Object.entries(ev)) {
      if (k !== "data" && k !== "data_base64" && v !== undefined) attrs[k] = String(v);
    }
    sent.push({ stream: ack.stream, seq: ack.seq, attributes: attrs, data: ev.data });
  }
} catch (err) {
  errors.push(`failed: ${err.stack || err}`);
} finally {
  await nc.drain();
}

process.stdout.write(JSON.stringify({ received, sent, errors }) + "\n");
process.exit(errors.length ? 1 : 0);
