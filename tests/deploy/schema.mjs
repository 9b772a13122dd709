// Validates Kubernetes objects against the API schemas of the npm package kubernetes-models
// (and @kubernetes-models/prometheus-operator for ServiceMonitor and PodMonitor), offline.
//
// The packages' validators check types, enums and required fields but accept unknown
// fields, which the API server drops (or rejects under strict field validation). A typo such
// as `readinesProbe` would pass them, so validation also records which fields the validator
// reads: a field it never looks at is not in the schema and is reported as unknown. Maps
// (labels, data, resources) are read by enumerating their keys, so they are not reported.
import * as k8s from "kubernetes-models";
import * as prometheusOperator from "@kubernetes-models/prometheus-operator";

function collectModels(namespace, into, seen = new Set()) {
  if (namespace === null || seen.has(namespace)) return into;
  seen.add(namespace);
  for (const value of Object.values(namespace)) {
    if (typeof value === "function" && typeof value.apiVersion === "string" && typeof value.kind === "string") {
      into.set(`${value.apiVersion}/${value.kind}`, value);
    } else if (value !== null && typeof value === "object") {
      collectModels(value, into, seen);
    }
  }
  return into;
}

const MODELS = collectModels(prometheusOperator, collectModels(k8s, new Map()));

// Wraps `value` so that reads of its properties are recorded, recursively.
function track(value, where, records) {
  if (value === null || typeof value !== "object") return value;
  const isArray = Array.isArray(value);
  const rec = { where, target: value, read: new Set(), enumerated: isArray };
  records.push(rec);
  const copy = isArray ? [] : Object.create(Object.getPrototypeOf(value));
  for (const [k, v] of Object.entries(value)) copy[k] = track(v, `${where}/${k}`, records);
  return new Proxy(copy, {
    get(t, k, r) {
      if (typeof k === "string") rec.read.add(k);
      return Reflect.get(t, k, r);
    },
    has(t, k) {
      if (typeof k === "string") rec.read.add(k);
      return Reflect.has(t, k);
    },
    ownKeys(t) {
      rec.enumerated = true;
      return Reflect.ownKeys(t);
    },
  });
}

// Returns the problems of one object as messages "PATH: problem"; empty when it is valid.
export function validateObject(obj) {
  const Model = MODELS.get(`${obj.apiVersion}/${obj.kind}`);
  if (!Model) return [`: no schema for apiVersion ${obj.apiVersion} kind ${obj.kind}`];
  const records = [];
  const instance = track(new Model(obj), "", records);
  try {
    Model.prototype.validate.call(instance);
  } catch (e) {
    const details = e.errors ?? [{ instancePath: "", message: e.message }];
    return details.map((d) => `${d.instancePath}: ${d.message}${d.params?.allowedValues ? ` (${d.params.allowedValues.join(", ")})` : ""}`);
  }
  // Records are in document order, parents first: fields below an unknown one are not
  // reported again.
  const unknown = [];
  for (const rec of records) {
    if (rec.enumerated || unknown.some((u) => rec.where === u || rec.where.startsWith(`${u}/`))) continue;
    for (const k of Object.keys(rec.target)) {
      if (!rec.read.has(k)) unknown.push(`${rec.where}/${k}`);
    }
  }
  return unknown.map((u) => `${u}: unknown field`);
}
