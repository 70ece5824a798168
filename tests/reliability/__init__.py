"""The reliability tests of issue 7: bad input, properties, crashes, load and codec safety."""
