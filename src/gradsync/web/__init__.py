"""The live browser view (gradsync serve)."""
