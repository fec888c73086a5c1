// What the console uses of age-encryption (typage): decrypting to an X25519 identity it is given.
export { Decrypter, identityToRecipient } from "age-encryption";
