"""The conformance machines, engine against model: the test suite's limits machine and
pipeline hunts, shipped so that ``ductwork verify`` runs them against an adopter's database
(:mod:`~ductwork_proof.conformance.limits`, :mod:`~ductwork_proof.conformance.pipelines`)."""
