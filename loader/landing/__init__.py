"""The landing area: the change-record format every stage reads, its stores and writer, and the state kept beside the files."""
