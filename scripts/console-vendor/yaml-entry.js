// What the console uses of yaml: parsing the runner editor's text (with source positions) and writing it.
export { LineCounter, isMap, isScalar, isSeq, parseDocument, stringify } from "yaml";
