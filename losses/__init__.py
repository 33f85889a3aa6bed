"""Loss functions and the return estimators they are built on."""
