//! age encryption and SHA-256, the two primitives every part and manifest goes through.

use std::io::{Read, Write};

use age::x25519;
use sha2::{Digest, Sha256};

/// Lower-case hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Lower-case hex SHA-256 of the file at `path`, read in a stream.
pub fn sha256_file(path: &std::path::Path) -> std::io::Result<String> {
    sha256_of(&mut std::fs::File::open(path)?)
}

/// Lower-case hex SHA-256 of everything `reader` gives, read in a stream (a file already open:
/// the bytes of that file, whatever its name names by now).
pub fn sha256_of(reader: &mut impl Read) -> std::io::Result<String> {
    let mut hasher = Sha256::new();
    std::io::copy(reader, &mut hasher)?;
    Ok(hex::encode(hasher.finalize()))
}

/// Encrypts `plaintext` as one age file to `recipients`, appending it to `out`.
pub fn encrypt(recipients: &[x25519::Recipient], plaintext: &[u8], out: &mut Vec<u8>) {
    let encryptor =
        age::Encryptor::with_recipients(recipients.iter().map(|r| r as &dyn age::Recipient))
            .expect("x25519 recipients are always compatible and the list is never empty");
    // Writing to a Vec cannot fail.
    let mut writer = encryptor.wrap_output(out).expect("writing to memory");
    writer.write_all(plaintext).expect("writing to memory");
    writer.finish().expect("writing to memory");
}

/// An upper bound of the length of an age file of `plaintext` bytes to one or a few
/// recipients: its header, and a 16-byte tag per 64 KiB chunk.
pub fn encrypted_len(plaintext: usize) -> usize {
    plaintext + (plaintext / (64 << 10) + 1) * 16 + 1024
}

/// Why an age file could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("not decryptable with the given identity, or damaged ({0})")]
    Decrypt(#[from] age::DecryptError),
    #[error("damaged: {0}")]
    Payload(std::io::Error),
    #[error("decrypts to more than the {0} bytes allowed")]
    TooLong(u64),
}

/// Decrypts one age file held in memory, refusing plaintexts longer than `max_len`.
pub fn decrypt(
    identities: &[x25519::Identity],
    ciphertext: &[u8],
    max_len: u64,
) -> Result<Vec<u8>, OpenError> {
    let decryptor = age::Decryptor::new_buffered(ciphertext)?;
    let reader = decryptor.decrypt(identities.iter().map(|i| i as &dyn age::Identity))?;
    let mut plaintext = Vec::with_capacity(ciphertext.len());
    reader
        .take(max_len + 1)
        .read_to_end(&mut plaintext)
        .map_err(OpenError::Payload)?;
    if plaintext.len() as u64 > max_len {
        return Err(OpenError::TooLong(max_len));
    }
    Ok(plaintext)
}
