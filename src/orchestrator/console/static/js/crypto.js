// Decrypting in the page: logs, log chunks and outputs are age ciphertext (standard base64) that only
// the user's identity opens. The identity is given to the vendored age implementation (typage) here and
// nowhere else: no request ever carries it.

import { Decrypter, identityToRecipient } from "../vendor/age.js";

/** The identities in `text` (an age identity file: comments, blank lines, AGE-SECRET-KEY-1... lines). */
export function identities(text) {
  return String(text || "")
    .split(/\r?\n/)
    .map((line) => line.trim())
    .filter((line) => /^AGE-SECRET-KEY-(PQ-)?1[0-9A-Z]+$/.test(line));
}

/** The first identity of `text`, checked (its recipient is computed); throws with a message if none. */
export async function parseIdentity(text) {
  const found = identities(text);
  if (!found.length) throw new Error("no age identity found: paste a line starting with AGE-SECRET-KEY-1");
  try {
    const recipient = await identityToRecipient(found[0]);
    return { identity: found[0], recipient };
  } catch {
    throw new Error("the age identity is not valid");
  }
}

function fromBase64(text) {
  const binary = atob(String(text).replace(/\s+/g, ""));
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i += 1) bytes[i] = binary.charCodeAt(i);
  return bytes;
}

/** The UTF-8 plaintext of base64 age ciphertext; throws Error("…does not decrypt…") otherwise. */
export async function decryptText(ciphertextB64, identity) {
  let bytes;
  try {
    bytes = fromBase64(ciphertextB64);
  } catch {
    throw new Error("the ciphertext is not base64");
  }
  const decrypter = new Decrypter();
  decrypter.addIdentity(identity);
  try {
    return await decrypter.decrypt(bytes, "text");
  } catch {
    throw new Error("it does not decrypt with this identity");
  }
}

/** One live log chunk's plaintext ({v, deployment_id, seq, phase, text}), checked to be chunk `seq` of
 * `deploymentId` (a chunk moved from elsewhere is refused, as octl refuses it). */
export async function decryptChunk(ciphertextB64, identity, deploymentId, seq) {
  const chunk = JSON.parse(await decryptText(ciphertextB64, identity));
  if (chunk.deployment_id !== deploymentId || chunk.seq !== seq) {
    throw new Error(`log chunk ${seq} holds chunk ${chunk.seq} of deployment ${chunk.deployment_id}: it was moved`);
  }
  return chunk;
}
