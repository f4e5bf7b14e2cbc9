/**
 * The part of the ONNX protobuf schema that the export writes, as a protobufjs reflection
 * description (so it ships inside the compiled JavaScript, with no `.proto` file to find at run
 * time). Message and field names and numbers are those of the ONNX specification,
 * https://github.com/onnx/onnx/blob/main/onnx/onnx.proto (proto2 syntax); only the messages and
 * fields used here are declared, and a reader that knows the full schema reads the bytes as the
 * same messages.
 * @packageDocumentation
 */
import protobuf from 'protobufjs';

/** `TensorProto.DataType` values (onnx.proto) of the element types the export writes. */
export const ONNX_DTYPE = {
  FLOAT: 1,
  UINT8: 2,
  INT8: 3,
  INT32: 6,
  INT64: 7,
  FLOAT16: 10,
} as const;

/** An element type the export writes, by its `TensorProto.DataType` value. */
export type OnnxDataType = (typeof ONNX_DTYPE)[keyof typeof ONNX_DTYPE];

/** `AttributeProto.AttributeType` values (onnx.proto) of the attribute kinds the export writes. */
export const ONNX_ATTRIBUTE_TYPE = { FLOAT: 1, INT: 2, STRING: 3, INTS: 7 } as const;

/** `TensorProto`: an initializer, with its data in `rawData` (little-endian, row-major). */
export interface OnnxTensor {
  name: string;
  dims: number[];
  dataType: OnnxDataType;
  rawData: Uint8Array;
  docString?: string;
}

/** `AttributeProto` (one of `f`, `i`, `s`, `ints`, as `type` says). */
export interface OnnxAttribute {
  name: string;
  type: (typeof ONNX_ATTRIBUTE_TYPE)[keyof typeof ONNX_ATTRIBUTE_TYPE];
  f?: number;
  i?: number;
  s?: Uint8Array;
  ints?: number[];
}

/** `NodeProto`. */
export interface OnnxNode {
  input: string[];
  output: string[];
  name: string;
  opType: string;
  domain?: string;
  attribute: OnnxAttribute[];
  docString?: string;
}

/** `TensorShapeProto.Dimension`: a fixed size or a symbolic name. */
export type OnnxDim = { dimValue: number } | { dimParam: string };

/** `ValueInfoProto` of a tensor. */
export interface OnnxValueInfo {
  name: string;
  type: { tensorType: { elemType: OnnxDataType; shape: { dim: OnnxDim[] } } };
  docString?: string;
}

/** `GraphProto`. */
export interface OnnxGraph {
  node: OnnxNode[];
  name: string;
  initializer: OnnxTensor[];
  docString?: string;
  input: OnnxValueInfo[];
  output: OnnxValueInfo[];
}

/** `ModelProto`. */
export interface OnnxModel {
  irVersion: number;
  opsetImport: { domain: string; version: number }[];
  producerName: string;
  producerVersion: string;
  domain?: string;
  modelVersion?: number;
  docString?: string;
  graph: OnnxGraph;
  metadataProps: { key: string; value: string }[];
}

type Fields = Record<string, { rule?: 'repeated'; type: string; id: number; options?: Record<string, unknown> }>;

/** A repeated field; scalars unpacked, as proto2 writes them (readers accept both encodings). */
const repeated = (type: string, id: number) => ({
  rule: 'repeated' as const,
  type,
  id,
  ...(type === 'int64' ? { options: { packed: false } } : {}),
});
const one = (type: string, id: number) => ({ type, id });

/** The messages, with the field numbers of onnx.proto. */
const MESSAGES: Record<string, { fields: Fields; oneofs?: Record<string, { oneof: string[] }> }> = {
  StringStringEntryProto: { fields: { key: one('string', 1), value: one('string', 2) } },
  OperatorSetIdProto: { fields: { domain: one('string', 1), version: one('int64', 2) } },
  TensorProto: {
    fields: {
      dims: repeated('int64', 1),
      dataType: one('int32', 2),
      name: one('string', 8),
      rawData: one('bytes', 9),
      docString: one('string', 12),
    },
  },
  AttributeProto: {
    fields: {
      name: one('string', 1),
      f: one('float', 2),
      i: one('int64', 3),
      s: one('bytes', 4),
      ints: repeated('int64', 8),
      docString: one('string', 13),
      type: one('int32', 20),
    },
  },
  NodeProto: {
    fields: {
      input: repeated('string', 1),
      output: repeated('string', 2),
      name: one('string', 3),
      opType: one('string', 4),
      attribute: repeated('AttributeProto', 5),
      docString: one('string', 6),
      domain: one('string', 7),
    },
  },
  TensorShapeProto: {
    fields: { dim: repeated('TensorShapeProto.Dimension', 1) },
  },
  'TensorShapeProto.Dimension': {
    fields: { dimValue: one('int64', 1), dimParam: one('string', 2), denotation: one('string', 3) },
    oneofs: { value: { oneof: ['dimValue', 'dimParam'] } },
  },
  'TypeProto.Tensor': { fields: { elemType: one('int32', 1), shape: one('TensorShapeProto', 2) } },
  TypeProto: {
    fields: { tensorType: one('TypeProto.Tensor', 1), denotation: one('string', 6) },
    oneofs: { value: { oneof: ['tensorType'] } },
  },
  ValueInfoProto: {
    fields: { name: one('string', 1), type: one('TypeProto', 2), docString: one('string', 3) },
  },
  GraphProto: {
    fields: {
      node: repeated('NodeProto', 1),
      name: one('string', 2),
      initializer: repeated('TensorProto', 5),
      docString: one('string', 10),
      input: repeated('ValueInfoProto', 11),
      output: repeated('ValueInfoProto', 12),
      valueInfo: repeated('ValueInfoProto', 13),
    },
  },
  ModelProto: {
    fields: {
      irVersion: one('int64', 1),
      producerName: one('string', 2),
      producerVersion: one('string', 3),
      domain: one('string', 4),
      modelVersion: one('int64', 5),
      docString: one('string', 6),
      graph: one('GraphProto', 7),
      opsetImport: repeated('OperatorSetIdProto', 8),
      metadataProps: repeated('StringStringEntryProto', 14),
    },
  },
};

/** The `onnx` package as a protobufjs namespace description (nested types under their parents). */
function schemaJson(): protobuf.INamespace {
  const nested: Record<string, protobuf.IType> = {};
  for (const [name, message] of Object.entries(MESSAGES)) {
    const [outer, inner] = name.split('.') as [string, string | undefined];
    const type: protobuf.IType = { fields: message.fields, ...(message.oneofs ? { oneofs: message.oneofs } : {}) };
    if (inner === undefined) {
      nested[outer] = { ...type, nested: { ...(nested[outer]?.nested ?? {}) } };
    } else {
      const parent = nested[outer] ?? { fields: {} };
      parent.nested = { ...(parent.nested ?? {}), [inner]: type };
      nested[outer] = parent;
    }
  }
  return { nested: { onnx: { nested } } };
}

let root: protobuf.Root | undefined;

/** The protobufjs type of `onnx.<name>`, from the schema above (built once). */
export function onnxType(name: 'ModelProto' | 'TensorProto' | 'NodeProto'): protobuf.Type {
  root ??= protobuf.Root.fromJSON(schemaJson());
  return root.lookupType(`onnx.${name}`);
}

/** Encodes a model to the bytes of an `.onnx` file. */
export function encodeOnnxModel(model: OnnxModel): Uint8Array {
  const type = onnxType('ModelProto');
  const message = type.fromObject(model);
  return type.encode(message).finish();
}

/** Decodes the bytes of an `.onnx` file (the fields declared above; others are skipped). */
export function decodeOnnxModel(bytes: Uint8Array): OnnxModel {
  const type = onnxType('ModelProto');
  return type.toObject(type.decode(bytes), {
    longs: Number,
    bytes: Uint8Array,
    defaults: false,
    arrays: true,
  }) as unknown as OnnxModel;
}
