"""Where proposals come from: the contract every drafter keeps and the base class a user's
drafter derives from (base), the table of kinds (registry), and one module per kind: prompt
lookup, suffix (SuffixDecoding), full model, MTP heads (mtp, with Gemma 4's assistant). Adding a
kind is one registry row and one module here."""
